"""Exceptions raised to users, each naming the problem and how to fix it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # importing torch.fx costs a second; the CLI imports this module
    import torch.fx


class TpuInductorError(RuntimeError):
    """Base class of every error tpu_inductor raises on purpose."""


class ConfigError(TpuInductorError, ValueError):
    """An option or environment variable has a bad name or value."""


class PlatformUnavailableError(TpuInductorError):
    """The requested PJRT platform is not installed on this machine."""


class UnsupportedOpError(TpuInductorError):
    """An op cannot run on the device and ``strict`` forbids the eager fallback."""


class LoweringError(TpuInductorError):
    """torch-mlir or XLA rejected a graph that the support table accepted."""


class OutputMismatchError(LoweringError):
    """An executable returned shapes or dtypes other than the graph promises:
    its island runs eagerly instead (a wrong result is never returned)."""


class RanksDisagreeError(TpuInductorError):
    """Under torchrun, the ranks compiled different collectives: running them would hang."""


class RecompileBudgetError(TpuInductorError):
    """A dim of a dynamic graph needs more sizes than ``recompile_budget`` and ``strict`` is on."""


class RecompileBudgetWarning(UserWarning):
    """A dim of a dynamic graph spent its ``recompile_budget`` of sizes; new ones run eagerly."""


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def user_source_line(node: torch.fx.Node) -> Optional[str]:
    """The innermost ``file:line`` of user code that produced ``node``.

    When the compiled callable is a ``torch.nn`` module itself, Dynamo keeps
    no stack trace of its code: the module path names the place instead
    (``module layers.0 (TransformerEncoderLayer)``), never a bare ``?``.
    """
    stack = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(stack)
    if frames:
        path, line = frames[-1]
        return f"{path}:{line}"
    modules = node.meta.get("nn_module_stack") or {}
    if not modules:
        return None
    path, kind = list(modules.values())[-1]
    kind_name = kind.__name__ if isinstance(kind, type) else str(kind).rsplit(".", 1)[-1].rstrip("'>")
    return f"module {_module_path(path)} ({kind_name})"


def _module_path(dynamo_path: str) -> str:
    """``layers.0`` for Dynamo's ``L['fn'].layers.0`` / ``L['self'].layers[0]``."""
    path = re.sub(r"^L\[['\"]\w+['\"]\]\.?", "", dynamo_path)
    path = re.sub(r"\[(\d+)\]", r".\1", path).replace("._modules['", ".").replace("']", "")
    return path or "(the compiled one)"


def describe_node(node: torch.fx.Node) -> str:
    """``aten.foo.default (at model.py:12)`` for error messages and reports."""
    where = user_source_line(node)
    return f"{op_name(node)}" + (f" (at {where})" if where else "")


def op_name(node: torch.fx.Node) -> str:
    import torch

    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))
