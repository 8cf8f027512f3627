"""Every private PyTorch API tpu_inductor uses, in one place.

Why one module: the backend plugs into Dynamo, AOTAutograd, FakeTensor and
PyTorch's logging through names that are not public and move between
releases (we support torch 2.11 to 2.13, ``pyproject.toml``). A name that
moved, or a decomposition a release added, is then handled once, with the
versions named, instead of as an ``ImportError`` in whichever module used
it first. ``tests/test_code_layout.py`` keeps it that way.

Names are looked up when first used, not when this module is imported:
several live in modules whose import is costly (AOTAutograd's cache pulls in
Inductor's code generators), and a first call should pay only for what it
uses. ``torch._ops.OpOverload`` (the type of every ATen op) is not listed:
it is used as a type everywhere, and has not moved.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
from typing import Any, Callable, Iterator, Mapping, Optional

import torch

_NAMES: dict[str, tuple[str, str]] = {
    # Where the backend plugs into Dynamo and AOTAutograd.
    "aot_autograd": ("torch._dynamo.backends.common", "aot_autograd"),
    "min_cut_rematerialization_partition": ("torch._functorch.partitioners", "min_cut_rematerialization_partition"),
    # AOTAutogradCache (aot_cache.py; docs/design/aot-autograd-cache.md).
    "BypassAOTAutogradCache": ("torch._functorch._aot_autograd.autograd_cache", "BypassAOTAutogradCache"),
    "SerializableAOTDispatchCompiler": ("torch._functorch.aot_autograd", "SerializableAOTDispatchCompiler"),
    "OutputCode": ("torch._inductor.output_code", "OutputCode"),
    "functorch_config": ("torch._functorch", "config"),
    "dynamo_config": ("torch._dynamo", "config"),
    # FakeTensor: the values the passes read and write in node.meta["val"].
    "FakeTensor": ("torch._subclasses.fake_tensor", "FakeTensor"),
    "detect_fake_mode": ("torch._guards", "detect_fake_mode"),
    "unset_fake_temporarily": ("torch._subclasses.fake_tensor", "unset_fake_temporarily"),
    "FakeTensorMode": ("torch._subclasses.fake_tensor", "FakeTensorMode"),
    # Dynamo's counters (graph breaks, AOTAutogradCache hits).
    "dynamo_counters": ("torch._dynamo.utils", "counters"),
    # Structured tracing (TORCH_TRACE) and TORCH_LOGS.
    "trace_structured": ("torch._logging", "trace_structured"),
    # FX: pickling a graph with FakeTensor metadata (the traced cache level), and
    # the GraphModule that compiles its code on first call (placement/partition.py).
    "GraphPickler": ("torch.fx._graph_pickler", "GraphPickler"),
    "GraphPicklerOptions": ("torch.fx._graph_pickler", "Options"),
    "LazyGraphModule": ("torch.fx._lazy_graph_module", "_LazyGraphModule"),
    # Sizes as Python source, the form Dynamo's guards are evaluated in (dynamic/size_functions.py).
    "PythonPrinter": ("torch.utils._sympy.printers", "PythonPrinter"),
    # torch.compiler.save_cache_artifacts() / load_cache_artifacts() (runtime/cache_artifacts.py).
    "CacheArtifact": ("torch.compiler._cache", "CacheArtifact"),
    "CacheArtifactFactory": ("torch.compiler._cache", "CacheArtifactFactory"),
    "CacheArtifactManager": ("torch.compiler._cache", "CacheArtifactManager"),
    # FlexAttention's higher-order op and PyTorch's math implementation of it
    # (passes/flex_attention_as_math.py).
    "flex_attention_op": ("torch._higher_order_ops.flex_attention", "flex_attention"),
    "flex_attention_math": ("torch._higher_order_ops.flex_attention", "math_attention"),
}
"""Our name -> (module, attribute) of a private torch API, resolved on first use."""


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _NAMES[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # the next lookup is an ordinary global
    return value


def pytorch_decomposition(op: torch._ops.OpOverload) -> Optional[Callable]:
    """PyTorch's own decomposition of ``op``, or None where this torch has none
    (``max_pool3d_with_indices`` and ``adaptive_max_pool2d`` have one from
    2.12 on)."""
    return torch._decomp.decomposition_table.get(op)


def register_inductor_prims() -> None:
    """Register Inductor's prims (``prims.fma``) with the dispatcher; Dynamo
    has imported the module already, so this costs no import time."""
    importlib.import_module("torch._inductor.inductor_prims")


tensor_from_dlpack: Callable[[Any], torch.Tensor] = torch._C._from_dlpack
"""``torch.from_dlpack`` of a capsule without its Python-side checks: bound,
not wrapped, since it runs for every tensor an island returns."""


SET_GRAD_ENABLED: Callable[[bool], None] = torch._C._set_grad_enabled
"""The call ``torch.no_grad()`` and ``torch.enable_grad()`` put in a Dynamo graph."""


@contextlib.contextmanager
def above_autograd(kernels: Mapping[torch._ops.OpOverload, Callable]) -> Iterator[None]:
    """Trace these CompositeImplicitAutograd ops (or ops PyTorch decomposes
    at autograd in Python) as ``kernels`` say, above autograd, while the block runs.

    A composite op's C++ kernel runs before a decomposition table is
    consulted, so what autograd records is whatever that kernel calls, with
    that op's backward. The Python dispatcher (on while AOTAutograd traces)
    prefers an op's Python kernel for ``CompositeImplicitAutograd``, which
    is how PyTorch's own ``torch._decomp`` reroutes ``dropout``; here only
    for the block, so that other backends in the process trace as before.
    A kernel that returns ``NotImplemented`` hands the call to the C++ one.
    """
    saved = {}
    for op, kernel in kernels.items():
        # An op PyTorch itself decomposes at autograd (a Python kernel of its
        # own there, as ``multilabel_margin_loss_forward`` has) is replaced
        # at that key; a composite op at its composite kernel.
        key = _AUTOGRAD if _AUTOGRAD in op.py_kernels else _COMPOSITE

        def python_kernel(*args: Any, op=op, kernel=kernel, key=key, **kwargs: Any) -> Any:
            result = kernel(*args, **kwargs)
            return op._op_dk(key, *args, **kwargs) if result is NotImplemented else result

        saved[op] = (key, op.py_kernels.get(key))
        op.py_kernels[key] = python_kernel
        op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, (key, previous) in saved.items():
            if previous is None:
                del op.py_kernels[key]
            else:
                op.py_kernels[key] = previous
            op._dispatch_cache.clear()


_AUTOGRAD = torch._C.DispatchKey.Autograd
_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


def operator_schemas(prefix: str) -> list[Any]:
    """The ``torch._C.FunctionSchema`` of every registered operator whose name
    (``aten::_foreach_add``) starts with ``prefix``: every overload, also
    those no ``torch.ops`` lookup has loaded yet."""
    return [schema for schema in torch._C._jit_get_all_schemas() if schema.name.startswith(prefix)]


def static_input_indices() -> Optional[tuple[int, ...]]:
    """The graph inputs AOTAutograd learnt from Dynamo are parameters and
    buffers (the list Inductor's CUDA graphs use), or None outside a compile."""
    tracing = torch._guards.TracingContext.try_get()
    if tracing is None or tracing.fw_metadata is None:
        return None
    return tuple(tracing.fw_metadata.static_input_indices)


def inputs_written_in_place() -> Optional[tuple[int, tuple[tuple[int, int], ...]]]:
    """The number of graph inputs AOTAutograd traced, and ``(output position,
    input position)`` of each input whose new value the graph returns for
    AOTAutograd to copy back into it (mutated inputs' new values come first,
    in input order), where the input is written in its data alone and does
    not require grad; None outside a compile or where the metadata does not
    say it plainly."""
    tracing = torch._guards.TracingContext.try_get()
    meta = getattr(tracing, "fw_metadata", None)
    if meta is None:
        return None
    try:
        mutated = list(meta.mutated_inp_runtime_indices)
        info = meta.input_info
        written = []
        for position, index in enumerate(mutated):
            entry = info[index]
            if entry.mutates_data and not entry.mutates_metadata and not entry.requires_grad \
                    and not entry.mutates_storage_metadata:
                written.append((position, index))
        return len(info), tuple(written)
    except (AttributeError, IndexError):  # another torch's metadata: nothing written in place
        return None


def traced_frame_and_compile_id() -> tuple[Optional[str], Optional[str]]:
    """The function Dynamo is tracing and its ``frame/recompile`` id; None for
    either where this torch's internals do not say."""
    frame = compile_id = None
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        code = InstructionTranslator.current_tx().f_code
        frame = _function_label(code.co_name, code.co_filename, code.co_firstlineno)
    except Exception:
        pass
    try:
        from torch._guards import CompileContext

        current = CompileContext.current_compile_id()
        compile_id = str(current) if current is not None else None
    except Exception:
        pass
    return frame, compile_id


def _function_label(name: str, filename: str, first_line: int) -> str:
    """``forward (model.py:12)``: how the report names a function Dynamo traced."""
    return f"{name} ({filename}:{first_line})"


def dynamic_sources_learned(function: str) -> list[str]:
    """Dynamo's names of the inputs and attributes of ``function`` (a label
    as :func:`traced_frame_and_compile_id` writes it) whose sizes or values
    its automatic dynamic has seen change in this process: what
    ``TORCH_COMPILE_DYNAMIC_SOURCES`` takes to trace them dynamic from a
    process's first trace (``torch._dynamo.pgo``'s profile, which writes
    the same list as advice). Empty where this torch does not say."""
    try:
        from torch._dynamo import pgo

        learned: list[str] = []
        for code, state in pgo.get_code_state().items():
            if _function_label(code.name, code.filename, code.firstlineno) == function:
                learned += [source for source in pgo._collect_dynamic_sources(state) if source not in learned]
        return learned
    except Exception:  # a private structure: advice only
        return []


def dynamic_sources_setting(sources: list[str]) -> str:
    """The ``TORCH_COMPILE_DYNAMIC_SOURCES`` value that names ``sources``.
    Dynamo deletes its spaces, splits it at commas and tries each entry as a
    regex as well as a name (``re.match``), so a name with a comma or a space
    (``dict.__getitem__(L['kwargs']['encoder_outputs'], ...)``) or one that
    is not a valid regex is written as an anchored regex of itself, those
    characters matching any character."""
    entries = []
    for source in sources:
        try:
            re.compile(source)
            plain = "," not in source and " " not in source
        except re.error:
            plain = False
        entries.append(source if plain else "".join("." if c in ", " else re.escape(c) for c in source) + "$")
    return ",".join(entries)


_LIMIT_FUNCTION = re.compile(r"'(?P<name>.+)' \((?P<file>.+):(?P<line>\d+)\)$")
"""How Dynamo's recompile-limit warning names the function: ``'forward' (model.py:12)``."""


def recompile_limit_function(dynamo_record: logging.LogRecord) -> Optional[str]:
    """The function (labelled as :func:`traced_frame_and_compile_id` does)
    that Dynamo's warning ``torch._dynamo hit config.recompile_limit`` is
    about; None for any other record, or where this torch words it otherwise."""
    message, args = str(dynamo_record.msg), dynamo_record.args
    if "hit config." not in message or not isinstance(args, tuple) or len(args) < 3:
        return None
    if not str(args[0]).endswith("recompile_limit"):  # recompile_limit, accumulated_recompile_limit
        return None
    match = _LIMIT_FUNCTION.match(str(args[2]))
    if match is None:
        return None
    return _function_label(match["name"], match["file"], int(match["line"]))


def recompile_reason() -> Optional[str]:
    """Dynamo's reason for the trace in progress (the failed guard), read from
    its metrics context; None where it does not say."""
    try:
        from torch._dynamo.utils import get_metrics_context

        reason = getattr(get_metrics_context(), "_metrics", {}).get("recompile_reason")
    except Exception:  # a private structure: informational only
        return None
    return str(reason) if reason else None


def register_log(name: str) -> None:
    """Make ``name`` a TORCH_LOGS name (``torch._logging.set_logs`` and its help know it)."""
    from torch._logging import _internal

    if not _internal.log_registry.is_log(name):
        _internal.register_log(name, name)


def structured_trace_enabled() -> bool:
    """Whether a structured trace is being written (TORCH_TRACE)."""
    from torch._logging._internal import trace_log

    return bool(trace_log.handlers)
