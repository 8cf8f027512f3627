"""Run an op on PyTorch's own kernel where that is measurably faster than XLA's.

Why: XLA's CPU convolutions lose to oneDNN, which eager PyTorch calls. The
ResNet-style CNN of ``benchmarks/perf.py`` (32x32, batch 16, one thread) ran
in 24.6 ms with every convolution in XLA and in 19.0 ms with them in eager
(Inductor: 18.4 ms); the islands between the convolutions still fuse
BatchNorm, ReLU and the residual adds. Which kernel wins depends on shapes,
so each candidate signature (op, input shapes and dtypes, arguments) is timed
once both ways on random inputs, at the process's thread counts (PyTorch's
and XLA's pool: runtime/threads.py), and the decision is kept beside the
cache, keyed by both counts, so that later compiles and processes with the
same threads choose the same way.

PyTorch's kernel is also timed on the calling thread alone, and a short
one runs there unless every thread saves more than starting OpenMP's
workers after an island costs (:data:`WORKER_START_S`; runtime/threads.py
says why).

A 2-D convolution chosen for eager runs channels-last, and the pointwise
ops around it follow (passes/channels_last.py); it is timed that way.
bfloat16/float16 matmuls are candidates too (XLA:CPU's half-precision dot
is the slow one there); the transposed weight such a matmul reads stays a
view in eager. Once those are chosen, an island that would only do a little
pointwise work next to them joins them in eager
(:func:`small_islands_between_eager_kernels`).

Only where torch and the device share memory (the CPU client): elsewhere an
eager op means a round trip between host and device. Option
``eager_kernels`` turns it off. Chosen nodes are reported as choices, not
as fallbacks: they lower, they just run faster in eager.

Before: ``island(x) -> [convolution, mul, add, relu]``;
after: ``convolution`` in eager, ``island -> [mul, add, relu]``.
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.fx
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule

from tpu_inductor.half_precision import HALF_FLOATS
from tpu_inductor.torch_api import unset_fake_temporarily

from tpu_inductor.passes.channels_last import (
    TO_CHANNELS_LAST,
    convolution_channels_last,
    run_channels_last,
    runs_channels_last,
)
from tpu_inductor.passes.conv_epilogue import fuse_convolution_epilogues
from tpu_inductor.placement.partition import TRANSPOSE_OPS, is_compute
from tpu_inductor.runtime.persisted_dict import PersistedDict
from tpu_inductor.runtime.threads import ON_CALLING_THREAD, on_calling_thread

log = logging.getLogger(__name__)

aten = torch.ops.aten

CANDIDATE_OPS = frozenset({aten.convolution.default})
"""Ops PyTorch's CPU build runs through a tuned library (oneDNN), in every float dtype."""

HALF_PRECISION_CANDIDATE_OPS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default})
"""...and in bfloat16/float16 only: there oneDNN's GEMM is several times
faster than XLA:CPU's dot (MLP of benchmarks/perf.py under bfloat16 autocast:
eager 2.4 ms, every dot in XLA 6.4 ms), while float32 dots measured even (MKL
and XLA within 5% on every MLP and decoder shape), so timing them would only
add compile time."""

EMBEDDING_BAG_OPS = frozenset({
    aten._embedding_bag.default,
    aten._embedding_bag_forward_only.default,
    aten._embedding_bag_backward.default,
    aten._embedding_bag_dense_backward.default,
    aten._embedding_bag_per_sample_weights_backward.default,
})
"""Always PyTorch's kernel, untimed: its embedding bags are one pass of
gathers and sums (FBGEMM), where XLA:CPU gathers every row and scatters it
into its bag. 20,000 lookups into 2,000 bags of a 100,000 x 64 table (AMD
EPYC, 2 cores), eager against decomposed on XLA:CPU: sum 0.12 against 2.7
ms, mean 0.23 against 2.0 ms, max 7.6 against 82 ms; a training step 7.1,
5.6 and 13.7 against 11.8, 20 and 93 ms. The backend left them whole for
this (decompositions/table.py's ``keep_embedding_bags``); elsewhere they
are decomposed and lowered (decompositions/embedding_bags.py)."""
_EMBEDDING_BAG_CHOICE = "PyTorch's embedding-bag kernels (FBGEMM) are 7-20x faster than XLA:CPU's gather and scatter (not timed)"

EAGER_MARGIN = 0.9
"""Eager must take under 90% of XLA's time: a near tie stays on the device,
where the op can fuse with its neighbours."""

CONVOLUTION_MARGIN = 1.0
"""...except for convolutions, whose ties go to oneDNN: in eager a
convolution still fuses its epilogue (passes/conv_epilogue.py), and on the
device, between channels-last neighbours, it pays two transposes its timing
alone leaves out. perf.py's CNN, where every convolution measured 4-15%
faster in eager: with the 0.9 margin, an island kept two of them and the
model ran 4.5% slower (same process, interleaved; in other processes the
timings put one 1x1 convolution there, 0.4% slower)."""

MIN_SAVING_S = 50e-6
"""...and save more than splitting the island costs: two device calls and
their DLPack crossings, about 20 us each on the CPU client. Small
convolutions (BiT at 32x32 became 49 islands) stay on the device."""

WORKER_START_S = 0.2e-3
"""What starting OpenMP's workers again costs a parallel PyTorch kernel
right after an island (2 cores): 0.08 ms for a 1.5 ms convolution (1.49 ->
1.57 ms after a release), 0.12-0.32 ms for MobileNet's stem convolution
(0.16 -> 0.28-0.48 ms), with stalls of ~3 ms in some calls on top (that
convolution's p90 after an island: 5 ms). A kernel whose every-thread time
does not save more than this on its calling-thread time runs on the
calling thread (MobileNet's stem: 0.16 ms against 0.33), if it takes under
twice this there (:func:`_saves_less_than_starting_workers`). 0.4 ms, which
counted the stalls at their worst, also sent the CNN's convolutions that
save 0.3 ms to one thread, and perf.py's CNN went from 1.09x Inductor to
1.00x/1.01x (two runs); timing each candidate right after an XLA call, as
in the graph, was more erratic still (the CNN ran 1.5x slower)."""

_TIMED_RUNS = 7
_TIMING_BUDGET_S = 0.25
"""Seconds of timed calls a kernel gets: one slower than this over
:data:`_TIMED_RUNS` is timed fewer times (once past 0.25 s a call). A tiny
model fed 1,008x1008 images (SAM 3's vision tower) has convolutions of 0.3
to 1.4 s a call, and nine calls of each of its three timings took 52 s of
its first call; there a run-to-run spread of a few percent is far inside
the margins a choice needs."""
_CALLING_THREAD_TIMED_BELOW_S = 20 * WORKER_START_S
"""A kernel slower than this on every thread is not timed on the calling
thread alone: it would have to run ten times faster there to qualify
(:func:`_saves_less_than_starting_workers`)."""
_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})


class KernelChooser:
    """Decides, per candidate node, whether PyTorch's kernel should run it."""

    def __init__(
        self,
        timings: PersistedDict,
        time_xla: Callable[[torch.fx.GraphModule, list], float],
        xla_threads: Optional[int] = None,
    ):
        self._timings = timings
        self._time_xla = time_xla
        self._xla_threads = xla_threads

    @classmethod
    def for_platform(cls, platform, timings_file: Optional[Path]) -> Optional["KernelChooser"]:
        """A chooser for ``platform``, or None where eager kernels cannot help.
        ``timings_file``: where timings persist (``CacheDir.kernel_timings_file``)."""
        if not platform.shares_host_memory or platform.name != "cpu":
            return None

        def time_xla(probe: torch.fx.GraphModule, inputs: list) -> float:
            from tpu_inductor.lowering.stablehlo import lower_to_stablehlo
            from tpu_inductor.runtime import DeviceExecutable, compile_stablehlo

            lowered = lower_to_stablehlo(probe, for_cpu=True)  # timed as it would run
            loaded, _ = compile_stablehlo(
                lowered.module, platform, None, input_specs=lowered.input_specs, isolate=True
            )
            executable = DeviceExecutable(loaded, platform, lowered.output_specs, name="kernel timing")
            return _median_seconds(lambda: executable(*inputs))

        return cls(PersistedDict(timings_file), time_xla, platform.xla_threads)

    def eager_choices(self, gm: torch.fx.GraphModule, lowers: Callable[[torch.fx.Node], bool]) -> dict:
        """Node -> reason, for the candidate nodes that should run in eager."""
        choices = {}
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in EMBEDDING_BAG_OPS:
                choices[node] = _EMBEDDING_BAG_CHOICE
                continue
            if node.op != "call_function" or not _is_candidate(node) or not lowers(node):
                continue
            signature = _signature(node)
            if signature is None:
                continue
            # Which kernel wins depends on how many threads each has: a
            # timing taken under torch.set_num_threads(1) does not decide a
            # process on every core.
            threads = torch.get_num_threads()
            key = f"{signature} @ {threads} torch / {self._xla_threads} XLA threads"
            timing = self._timings.get(key)
            if timing is None or len(timing) != 3:  # kept before the calling-thread time was
                timing = self._measure(gm, node)
                self._timings.put(key, timing, replace=True)
            every_thread_s, xla_s, one_thread_s = timing
            on_calling_thread = threads > 1 and _saves_less_than_starting_workers(every_thread_s, one_thread_s)
            eager_s = one_thread_s if on_calling_thread else every_thread_s
            margin = CONVOLUTION_MARGIN if node.target in CANDIDATE_OPS else EAGER_MARGIN
            if math.isinf(xla_s):
                choices[node] = "XLA cannot run it (lowered alone, torch-mlir or XLA refused it); PyTorch's kernel runs it"
            elif eager_s < margin * xla_s and xla_s - eager_s > MIN_SAVING_S:
                where = "on the calling thread" if on_calling_thread else f"on {threads} threads"
                choices[node] = (
                    f"PyTorch's kernel is faster here ({eager_s * 1e3:.3f} ms {where} vs XLA "
                    f"{xla_s * 1e3:.3f} ms, measured once per signature)"
                )
                choices.update(_transposed_operands(node))
            if node in choices and on_calling_thread:
                node.meta[ON_CALLING_THREAD] = True
        return choices

    def _measure(self, gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[float, float, float]:
        """Median seconds of PyTorch's kernel on every thread, of XLA's (inf
        where it does not lower alone), and of PyTorch's on the calling thread alone."""
        probe, probe_inputs, _ = fuse_as_graphmodule(gm, [node], "kernel_probe", always_return_tuple=True)
        generator = torch.Generator().manual_seed(0)
        # Compilers run under the tracing fake mode: these must be real tensors.
        with unset_fake_temporarily(), torch.no_grad():
            values = {
                arg: torch.randn(arg.meta["val"].shape, generator=generator).to(arg.meta["val"].dtype)
                for arg in probe_inputs
            }
            inputs = [values[arg] for arg in probe_inputs]
            if runs_channels_last(node):
                # Timed the way it would run: on an input the island already laid out.
                args = [values[a] if isinstance(a, torch.fx.Node) else a for a in node.args]
                args[0] = args[0].permute(TO_CHANNELS_LAST).contiguous()
                eager_call = functools.partial(convolution_channels_last, *args)
            else:
                eager_call = functools.partial(probe, *inputs)
            every_thread_s = _median_seconds(eager_call)
            # On one thread already, timing it again would only repeat the first.
            worth_timing_alone = torch.get_num_threads() > 1 and every_thread_s < _CALLING_THREAD_TIMED_BELOW_S
            one_thread_s = _median_seconds(on_calling_thread(eager_call)) if worth_timing_alone else every_thread_s
            try:
                xla_s = self._time_xla(probe, inputs)
            except Exception as exc:  # torch-mlir and XLA raise many types
                # Timed alone, so this op is proven not to lower: its kernel is PyTorch's.
                log.info("tpu_inductor: %s does not lower alone: %s", _signature(node), exc)
                xla_s = math.inf
        log.info(
            "tpu_inductor: %s: eager %.3f ms (%.3f ms on the calling thread), XLA %.3f ms",
            _signature(node),
            every_thread_s * 1e3,
            one_thread_s * 1e3,
            xla_s * 1e3,
        )
        return every_thread_s, xla_s, one_thread_s


def _transposed_operands(matmul: torch.fx.Node) -> dict[torch.fx.Node, str]:
    """The transposes an eager matmul reads (``linear``'s ``t(weight)``): left
    to eager they are views the GEMM reads in place, where an island would
    write each transposed weight out on every call."""
    if matmul.target not in HALF_PRECISION_CANDIDATE_OPS:
        return {}
    return {
        operand: "transposed operand of a matmul on PyTorch's kernel, which reads it in place"
        for operand in matmul.all_input_nodes
        if operand.op == "call_function" and operand.target in TRANSPOSE_OPS
    }


SMALL_ISLAND_WORK = 1 << 18
"""Elements an island of pointwise ops may write and still run in eager when
it sits between PyTorch kernels. Inside a model, a PJRT call costs 30-400 us
on this CPU client (its first DLPack import after a oneDNN kernel alone ~30
us), where eager's ReLU over 64x1024 bfloat16 values takes ~10 us."""

_CASTS = frozenset({torch.ops.prims.convert_element_type.default, aten._to_copy.default})


def small_islands_between_eager_kernels(islands: list, chosen: dict[torch.fx.Node, str]) -> dict[torch.fx.Node, str]:
    """The compute nodes of islands that only do a little pointwise work next
    to a node that runs on PyTorch's kernel: node -> reason."""
    result = {}
    for island in islands:
        compute = [n for n in island.nodes if is_compute(n)]
        work = sum(n.meta["val"].numel() for n in compute if isinstance(n.meta.get("val"), torch.Tensor))
        if island.frozen or work > SMALL_ISLAND_WORK or not all(_is_pointwise(n) for n in compute):
            continue
        neighbours = {m for n in island.nodes for m in (*n.all_input_nodes, *n.users)}
        if neighbours.isdisjoint(chosen):
            continue
        reason = f"{work} elements of pointwise work between PyTorch kernels: cheaper in eager than a device call"
        result.update({node: reason for node in compute})
    return result


def _is_pointwise(node: torch.fx.Node) -> bool:
    target = node.target
    return target in _CASTS or (isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags)


def _is_candidate(node: torch.fx.Node) -> bool:
    if node.target in CANDIDATE_OPS:
        return True
    value = node.meta.get("val")
    return (
        node.target in HALF_PRECISION_CANDIDATE_OPS
        and isinstance(value, torch.Tensor)
        and value.dtype in HALF_FLOATS
    )


def choose_eager_kernels(
    gm: torch.fx.GraphModule, chooser: Optional[KernelChooser], lowers: Callable[[torch.fx.Node], bool]
) -> dict[torch.fx.Node, str]:
    """Node -> reason for the ops that run on PyTorch's kernel; rewrites ``gm``
    so that the chosen 2-D convolutions run channels-last, with the pointwise
    ops after them fused in where oneDNN can (passes/conv_epilogue.py)."""
    if chooser is None:
        return {}
    return fuse_convolution_epilogues(gm, run_channels_last(gm, chooser.eager_choices(gm, lowers)))


def _signature(node: torch.fx.Node) -> Optional[str]:
    """The op with every input's exact shape and dtype and its other arguments;
    None when a shape is symbolic or a dtype is not a float one."""
    shapes = []
    for arg in node.all_input_nodes:
        value = arg.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.dtype not in _DTYPES:
            return None
        if any(not isinstance(s, int) for s in value.shape):
            return None
        shapes.append(f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}")
    others = [a for a in node.args if not isinstance(a, torch.fx.Node)]
    return f"{node.target}({', '.join(shapes)}; {others})"


def _saves_less_than_starting_workers(every_thread_s: float, one_thread_s: float) -> bool:
    """Whether a kernel is better on the calling thread: every thread saves
    less than :data:`WORKER_START_S`. Only a kernel under twice that on one
    thread qualifies: a larger one that measured no faster on every thread
    was timed while another process held a core (a 2.8 ms convolution of
    perf.py's CNN once measured so, and the CNN ran 0.84x Inductor)."""
    return one_thread_s < 2 * WORKER_START_S and one_thread_s - every_thread_s < WORKER_START_S


def _median_seconds(call: Callable[[], object]) -> float:
    """Median seconds of ``call`` after warming it up, over at most
    :data:`_TIMED_RUNS` calls and about :data:`_TIMING_BUDGET_S` seconds."""

    def timed() -> float:
        started = time.perf_counter()
        call()
        return time.perf_counter() - started

    call()  # first calls: allocation, lazy initialisation, oneDNN primitive caches
    second = timed()
    if second * _TIMED_RUNS > _TIMING_BUDGET_S:  # a slow kernel: its second call counts as a sample
        runs = int(_TIMING_BUDGET_S / second)
        return statistics.median([second, *(timed() for _ in range(runs - 1))])
    return statistics.median(timed() for _ in range(_TIMED_RUNS))
