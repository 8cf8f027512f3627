"""Bucket sizes: which static size a dynamic dim is padded up to.

Why: one executable per distinct size is a recompile storm (64 batch sizes,
64 XLA compiles). Padding to a few sizes bounds the compiles at the cost of
some wasted work: powers of two waste at most half, a step at most one step.
Only symbols the padding analysis proved safe are bucketed; the rest keep
their exact value. A bucket must also be a size the traced graph is valid
for: it may not exceed the analysis' upper bound (``pos_emb[:, :T]``) or
break one of Dynamo's guards (``s0 <= 64``, ``Eq(Mod(s0, 4), 0)``); then the
symbol compiles at its exact size for that call.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import sympy

from tpu_inductor.config import Config


@dataclasses.dataclass(frozen=True)
class BucketPolicy:
    """How a padding-safe size is rounded up (from :class:`~tpu_inductor.config.Config`)."""

    sizes: tuple[int, ...] = ()
    step: Optional[int] = None
    minimum: int = 2
    maximum: Optional[int] = None

    @classmethod
    def from_config(cls, config: Config) -> "BucketPolicy":
        return cls(config.bucket_sizes, config.bucket_step, config.bucket_min, config.bucket_max)

    def bucket(self, value: int, upper_bound: Optional[int] = None) -> int:
        """The padded size for ``value`` (``value`` itself when no bucket fits)."""
        if self.maximum is not None and value > self.maximum:
            return value
        if self.sizes:
            bucket = next((s for s in self.sizes if s >= value), value)
        elif self.step:
            bucket = -(-value // self.step) * self.step
        else:
            bucket = 1 << max(value - 1, 0).bit_length()
        bucket = max(bucket, self.minimum)
        if self.maximum is not None:
            bucket = min(bucket, self.maximum)
        if upper_bound is not None:
            bucket = min(bucket, upper_bound)
        return max(bucket, value)


def choose_buckets(
    sizes: Mapping[sympy.Symbol, int],
    safe: frozenset,
    upper_bounds: Mapping[sympy.Symbol, int],
    policy: BucketPolicy,
    shape_env,
) -> dict[sympy.Symbol, int]:
    """Padded values for ``sizes``: bucketed where safe, exact elsewhere."""
    bounds = {s: _upper_bound(s, upper_bounds, shape_env) for s in sizes}
    padded = {s: policy.bucket(v, bounds[s]) if s in safe else v for s, v in sizes.items()}
    if padded == dict(sizes) or satisfies_guards(padded, shape_env):
        return padded
    # Related sizes (a mask at least as long as the cache it covers: s1 >= s0 + 8)
    # may need a bigger bucket than each alone: raise some buckets a step.
    frontier = [padded]
    seen = {tuple(sorted(padded.items(), key=str))}
    for _ in range(_MAX_RAISES):
        raised = []
        for candidate in frontier:
            for symbol in sorted(safe & candidate.keys(), key=str):
                bigger = policy.bucket(candidate[symbol] + 1, bounds[symbol])
                if bigger <= candidate[symbol]:
                    continue
                option = {**candidate, symbol: bigger}
                key = tuple(sorted(option.items(), key=str))
                if key not in seen:
                    seen.add(key)
                    raised.append(option)
        raised.sort(key=lambda option: sum(option.values()))
        for option in raised:
            if satisfies_guards(option, shape_env):
                return option
        frontier = raised[:_FRONTIER]
    return _lowered_to_guards(padded, sizes, shape_env)


def _lowered_to_guards(padded: Mapping[sympy.Symbol, int], sizes: Mapping[sympy.Symbol, int], shape_env) -> dict:
    """The buckets lowered together, as little as Dynamo's guards need, toward
    the exact sizes: ``padded`` minus ``k`` each (never below its size), for
    the least ``k`` whose values keep the guards.

    A guard can bound a padded size by one compiled at its exact size: a
    sliding-window cache traced with the window a symbol
    (``torch.compile(..., dynamic=True)`` makes its Python int one) holds
    ``s0 + 2 < window`` until the window fills, so the cache's bucket 32
    broke it at every length past 16 and each length compiled exactly (past
    the recompile budget: eagerly). Lowered, they share the size 29, as a
    static window's bound (``upper_bounds``) caps a bucket. The search
    assumes the guards hold from some ``k`` on (the exact sizes hold them);
    where they do not, the exact sizes are returned.
    """

    def lowered(k: int) -> dict:
        return {s: max(sizes[s], v - k) for s, v in padded.items()}

    low, high = 0, max((v - sizes[s] for s, v in padded.items()), default=0)  # high: the exact sizes
    while low + 1 < high:
        middle = (low + high) // 2
        if satisfies_guards(lowered(middle), shape_env):
            high = middle
        else:
            low = middle
    return lowered(high)


_MAX_RAISES = 3
"""How many bucket steps above their own a set of related sizes may be raised."""
_FRONTIER = 16


def _upper_bound(symbol, upper_bounds: Mapping, shape_env) -> Optional[int]:
    bounds = [upper_bounds[symbol]] if symbol in upper_bounds else []
    value_range = getattr(shape_env, "var_to_range", {}).get(symbol) if shape_env else None
    if value_range is not None and value_range.upper.is_Integer:
        bounds.append(int(value_range.upper))
    return min(bounds) if bounds else None


def satisfies_guards(values: Mapping[sympy.Symbol, int], shape_env) -> bool:
    """Whether Dynamo's guards on the traced graph hold for ``values``."""
    if shape_env is None:
        return True
    substitution = {s: sympy.Integer(v) for s, v in values.items()}
    for guard in getattr(shape_env, "guards", ()):
        expr = guard.expr
        if not expr.free_symbols <= substitution.keys():
            continue
        if not bool(expr.xreplace(substitution)):
            return False
    for symbol, value in values.items():
        value_range = shape_env.var_to_range.get(symbol)
        if value_range is not None and not (value_range.lower <= value <= value_range.upper):
            return False
    return True
