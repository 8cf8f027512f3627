"""An input the graph writes in place (a static KV cache) gets only its new rows.

passes/input_writes_in_place.py turns AOTAutograd's copy-back of a written
input into the in-place write itself, after the islands; on a client that
keeps device copies (``zero_copy=False``, a TPU's path) the device copy gets
the same rows (runtime/resident_writes.py). What could go wrong, and is
checked here against eager step by step: a write that lands before a read
of the old value, a functional write mistaken for a mutation, a device copy
that misses a write (every later step would read stale rows).
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.report as report
from tpu_inductor.runtime.executable import resident_buffers
from tpu_inductor.runtime.platform import get_platform

STEPS = 5
SHAPE = (2, 4, 1024, 8)
"""256 KiB: above the size where sharing memory makes the copy-back cheaper (SHARED_MEMORY_MIN_BYTES)."""
ROWS = (2, 4, 2, 8)


class Cache(torch.nn.Module):
    """A KV-cache-like buffer written at ``positions`` each call, then read whole."""

    def __init__(self, write: str = "index_copy", shape: tuple[int, ...] = SHAPE) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(shape))
        self.weight = torch.nn.Parameter(torch.randn(shape[-1], shape[-1]))
        self.write = write

    def forward(self, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if self.write == "index_copy":
            self.cache.index_copy_(2, positions, rows)
        else:
            self.cache[:, :, positions] = rows
        return (self.cache @ self.weight).softmax(-1).sum(-2)


def _steps(model: torch.nn.Module, compiled, generator_seed: int = 0):
    """Yield (compiled result, eager result, compiled model's cache, eager model's cache) per step."""
    eager = Cache(model.write, tuple(model.cache.shape))
    eager.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(generator_seed)
    for step in range(STEPS):
        positions = torch.tensor([step, step + 3])
        rows = torch.randn(ROWS, generator=generator)
        with torch.no_grad():
            yield compiled(positions, rows), eager(positions, rows), model.cache, eager.cache


@pytest.mark.parametrize("write", ["index_copy", "index_put"])
@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "copies"])
def test_a_cache_written_each_call_matches_eager_and_crosses_once(write, zero_copy):
    torch.manual_seed(0)
    model = Cache(write)
    compiled = torch.compile(model, backend="tpu", options={"cache": False, "zero_copy": zero_copy, "strict": True})
    for got, want, cache, eager_cache in _steps(model, compiled):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        # The step's rows are in torch's own tensor, exactly: they were written, not computed.
        assert torch.equal(cache, eager_cache)
    graph = report.current().graphs[-1]
    assert graph.fallbacks == [] and len(graph.islands) == 1
    assert graph.inputs_written_in_place == 1
    assert "1 input written in place" in str(report.current())
    if not zero_copy:
        # Uploaded at the first call; every later call wrote its rows into the device copy.
        uploads = resident_buffers(get_platform("cpu", zero_copy=False)).uploads[id(model.cache)]
        assert uploads == 1


def test_a_functional_write_leaves_the_input_alone():
    """``index_copy`` (not ``_``) returns a new tensor: nothing may be written in place."""

    def f(cache, positions, rows):
        return cache.index_copy(2, positions, rows) * 2

    cache = torch.zeros(SHAPE)
    positions, rows = torch.tensor([1, 4]), torch.randn(ROWS)
    got = torch.compile(f, backend="tpu", options={"cache": False})(cache, positions, rows)
    torch.testing.assert_close(got, f(cache, positions, rows))
    assert not cache.any()
    assert report.current().graphs[-1].inputs_written_in_place == 0


def test_the_old_value_is_read_before_the_write():
    """A result read from the input before the write must see the old rows,
    on the device or in eager (``i0`` does not lower: it reads in eager)."""

    def f(cache, positions, rows):
        before = torch.special.i0(cache[:, :, :2]) + cache.sum()
        cache.index_copy_(2, positions, rows)
        return before, cache.sum(-1)

    start = torch.randn(SHAPE)
    positions, rows = torch.tensor([0, 1]), torch.randn(ROWS)
    mine, theirs = start.clone(), start.clone()
    got = torch.compile(f, backend="tpu", options={"cache": False})(mine, positions, rows)
    want = f(theirs, positions, rows)
    torch.testing.assert_close(got, want)
    assert torch.equal(mine, theirs)
    assert report.current().graphs[-1].inputs_written_in_place == 1


def test_repeated_indices_are_not_written_to_the_device_copy():
    """With a repeated index the host and the device could keep different rows:
    the device copy is dropped and uploaded again, and results follow the host."""
    torch.manual_seed(0)
    model = Cache()
    compiled = torch.compile(model, backend="tpu", options={"cache": False, "zero_copy": False})
    rows = torch.randn(ROWS)
    with torch.no_grad():
        compiled(torch.tensor([1, 2]), rows)
        compiled(torch.tensor([5, 5]), rows)
        got = compiled(torch.tensor([0, 3]), rows)
        expected = (model.cache @ model.weight).softmax(-1).sum(-2)
    torch.testing.assert_close(got, expected)
    assert resident_buffers(get_platform("cpu", zero_copy=False)).uploads[id(model.cache)] == 2


def test_a_small_input_sharing_memory_keeps_the_copy_back():
    """On the CPU client (memory shared with torch) copying a few KiB back
    costs less than an eager write: nothing is rewritten; results as eager's."""
    torch.manual_seed(0)
    model = Cache(shape=(2, 3, 8, 4))
    compiled = torch.compile(model, backend="tpu", options={"cache": False})
    with torch.no_grad():
        compiled(torch.tensor([1, 2]), torch.randn(2, 3, 2, 4))
    assert report.current().graphs[-1].inputs_written_in_place == 0


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "copies"])
def test_a_padded_graph_writes_the_callers_cache_after_its_call(zero_copy, monkeypatch):
    """A cache whose length changes between calls (a static cache sized to each
    prompt) is compiled with symbolic sizes and padded to a bucket: the write
    must land in the caller's cache, not in the padded copy, and only after
    every read of the old value. Step by step against eager, three lengths.

    The padded copy is kept and given the same write, so a cache is padded
    once, not at every step (dynamic/kept_padding.py), and padded afresh
    when something else changed it."""
    from tpu_inductor.runtime import transfer

    pads, uploads = [], []
    constant_pad_nd, upload = torch.constant_pad_nd, transfer.upload
    monkeypatch.setattr(
        torch, "constant_pad_nd", lambda t, *a: (pads.append(tuple(t.shape)), constant_pad_nd(t, *a))[1]
    )
    monkeypatch.setattr(transfer, "upload", lambda t, device: (uploads.append(tuple(t.shape)), upload(t, device))[1])
    weight = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))

    def step(cache, positions, rows):
        cache.index_copy_(2, positions, rows)
        return (cache @ weight).softmax(-1)

    compiled = torch.compile(step, backend="tpu", options={"cache": False, "zero_copy": zero_copy, "strict": True})
    generator = torch.Generator().manual_seed(1)
    for length in (40, 50, 60):
        cache, eager_cache = torch.zeros(2, 4, length, 8), torch.zeros(2, 4, length, 8)
        for position in range(STEPS):
            positions, rows = torch.tensor([position, position + 3]), torch.randn(ROWS, generator=generator)
            with torch.no_grad():
                torch.testing.assert_close(compiled(cache, positions, rows), step(eager_cache, positions, rows),
                                           rtol=1e-5, atol=1e-6)
            assert torch.equal(cache, eager_cache)
            if length == 60 and position == 1:  # a write of the caller's own: the kept copy is stale
                cache.mul_(0.5)
                eager_cache.mul_(0.5)
    dynamic = report.current().dynamic_graphs[-1]
    assert dynamic.padded and dynamic.device_calls == 2 * STEPS and dynamic.eager_calls == 0
    assert report.current().graphs[-1].inputs_written_in_place == 1
    # Lengths 50 and 60 run padded: once each, and once more after the caller's write.
    assert [shape for shape in pads if len(shape) == 4] == [(2, 4, 50, 8), (2, 4, 60, 8), (2, 4, 60, 8)]
    if not zero_copy:  # each padded copy crosses once: the device keeps its own write
        padded_uploads = [shape for shape in uploads if len(shape) == 4 and shape[2] > 60]
        assert len(padded_uploads) == 3, uploads


def _index_put_form(x: torch.Tensor, index: torch.Tensor, rows: torch.Tensor):
    """The in-place op and arguments ``input_writes_in_place`` picks for ``x[:, :, index] = rows``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tpu_inductor.passes.input_writes_in_place import _in_place_form

    def write(x, index, rows):
        return torch.ops.aten.index_put.default(x, [None, None, index], rows)

    gm = make_fx(write, tracing_mode="fake")(x, index, rows)
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.index_put.default)
    return _in_place_form(gm.graph, node)


def test_whole_rows_are_written_by_index_copy_and_anything_else_by_index_put():
    aten = torch.ops.aten
    cache, index = torch.zeros(2, 4, 16, 8), torch.tensor([3])
    op, args, _ = _index_put_form(cache, index, torch.zeros(2, 4, 1, 8))
    assert op is aten.index_copy_.default and args[0] == 2
    assert args[1].target is aten.where.self  # negative positions wrapped first
    # Rows that broadcast, or a mask, are index_put_'s alone.
    assert _index_put_form(cache, index, torch.zeros(1, 4, 1, 8))[0] is aten.index_put_.default
    mask = torch.zeros(16, dtype=torch.bool)
    assert _index_put_form(cache, mask, torch.zeros(2, 4, 0, 8))[0] is aten.index_put_.default


@pytest.mark.parametrize("padded", [False, True], ids=["static", "padded"])
def test_a_row_write_at_negative_positions_lands_where_eager_puts_it(padded, monkeypatch):
    """``cache[:, :, positions] = rows`` with positions counted from the end:
    the write runs as ``index_copy_``, which refuses them unwrapped."""
    from tpu_inductor.passes import input_writes_in_place

    writes = []
    finish = input_writes_in_place.DeferredWrites.finish
    monkeypatch.setattr(
        input_writes_in_place.DeferredWrites,
        "finish",
        lambda self, *args: (writes.extend(w.op for w in self.writes), finish(self, *args))[1],
    )
    weight = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))

    def step(cache, positions, x):
        cache[:, :, positions] = x.sum(2, keepdim=True).expand(2, 4, 2, 8)
        return (cache @ weight).softmax(-1)

    compiled = torch.compile(step, backend="tpu", options={"cache": False, "strict": True})
    length = 1024 if not padded else 64  # 256 KiB: written in place on a static graph
    cache = torch.randn(2, 4, length, 8, generator=torch.Generator().manual_seed(0))
    eager_cache = cache.clone()
    generator = torch.Generator().manual_seed(1)
    # Padded: x's length varies, so the graph is padded and the write deferred to after it.
    for x_length in (5, 9, 13) if padded else (5, 5, 5):
        for positions in (torch.tensor([-1, 2]), torch.tensor([3, -8])):
            x = torch.randn(2, 4, x_length, 8, generator=generator)
            with torch.no_grad():
                torch.testing.assert_close(compiled(cache, positions, x), step(eager_cache, positions, x),
                                           rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(cache, eager_cache)  # the rows are computed: not bit for bit
    assert report.current().graphs[-1].inputs_written_in_place == 1
    assert set(writes) == ({torch.ops.aten.index_copy_.default} if padded else set())


def test_a_padded_cache_written_along_another_dim_matches_eager():
    """The cache is padded along its length and written along its last dim:
    the write's rows come cut back to the real length, and go into the kept
    padded copy's real part (they once met its padded length: an error)."""
    weight = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))

    def step(cache, positions, rows):
        # The rows' length is the cache's: 2.13's index_copy decomposition
        # checks it, 2.11's does not, and there the two lengths stay two
        # symbols and the dim exact (docs/versions.md).
        torch._check(rows.size(2) == cache.size(2))
        cache.index_copy_(3, positions, rows)
        return (cache @ weight).softmax(-1)

    compiled = torch.compile(step, backend="tpu", options={"cache": False, "strict": True})
    generator = torch.Generator().manual_seed(1)
    for length in (40, 50, 60):
        cache, eager_cache = torch.zeros(2, 4, length, 8), torch.zeros(2, 4, length, 8)
        for position in range(3):
            positions, rows = torch.tensor([position, position + 4]), torch.randn(2, 4, length, 2, generator=generator)
            with torch.no_grad():
                torch.testing.assert_close(compiled(cache, positions, rows), step(eager_cache, positions, rows),
                                           rtol=1e-5, atol=1e-6)
            assert torch.equal(cache, eager_cache)
    assert report.current().dynamic_graphs[-1].padded


def test_a_kept_padded_copy_lives_as_long_as_its_argument_and_only_while_unchanged():
    from tpu_inductor.dynamic.kept_padding import KeptPadding

    kept = KeptPadding({0})
    cache = torch.zeros(2, 5)
    padded = torch.constant_pad_nd(cache, [0, 3], 0)
    kept.keep(0, cache, padded)
    rows, positions = torch.ones(2, 1), torch.tensor([1])
    cache.index_copy_(1, positions, rows)
    kept.write(0, cache, torch.Tensor.index_copy_, (1, positions, rows), {})
    cache.copy_(cache)  # AOTAutograd's copy-back of the argument into itself
    assert kept.reuse(0, cache, [2, 8]) is padded and torch.equal(padded[:, :5], cache)
    assert kept.reuse(0, cache, [2, 16]) is None  # another bucket
    cache.add_(1)  # a write of the caller's own
    assert kept.reuse(0, cache, [2, 8]) is None
    with torch.inference_mode():  # a copy made under inference_mode is never kept
        kept.keep(0, cache, torch.constant_pad_nd(cache, [0, 3], 0))
    assert kept.reuse(0, cache, [2, 8]) is None
    kept.keep(0, cache, padded)
    del cache
    assert not kept._kept  # the argument died: its padded copy is dropped


def test_size_functions_compute_what_sympy_substitutes():
    """Sizes a padded graph works out at every call, as generated Python:
    the same values as sympy's substitution, for each kind of size torch makes."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, PythonMod

    from tpu_inductor.dynamic.size_functions import SizeFunction

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    exprs = [s0 + 1, 2 * s0, FloorDiv(s0, 3), PythonMod(s0, 3), sympy.Max(1, s0 - 7), s0 * s1 + 3, 40 - s1,
             sympy.Integer(5)]
    sizes = SizeFunction(exprs)
    assert sizes._compiled is not None  # printed as Python, not substituted
    for values in ({s0: 1, s1: 2}, {s0: 17, s1: 64}):
        expected = tuple(int(e.xreplace({k: sympy.Integer(v) for k, v in values.items()})) for e in exprs)
        assert sizes(values) == expected
    assert SizeFunction([])({}) == ()
