"""The rules of the package's layout that a reviewer would otherwise check by hand.

* No module over 600 lines, in the package, its tests, benchmarks and examples: a module has one job.
* Every jax and jaxlib call goes through ``runtime/jaxlib_api.py``, where the
  differences between the jax releases it supports are handled (MLIR's own
  bindings, ``jaxlib.mlir``, excepted: they edit modules, they are not jax's API).
* Every private torch API (``torch._dynamo``, ``torch._functorch``, ...) goes
  through ``torch_api.py``, for the same reason (``torch._ops``, the type of
  every ATen op, excepted).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE = REPOSITORY / "tpu_inductor"
MODULES = sorted(PACKAGE.rglob("*.py"))
EVERY_MODULE = sorted(path for folder in ("tpu_inductor", "tests", "benchmarks", "examples")
                      for path in (REPOSITORY / folder).rglob("*.py"))
JAX_IMPORT = re.compile(r"^\s*(?:from\s+(jaxlib|jax)(\.[\w.]+)?\s+import|import\s+(jaxlib|jax)(\.[\w.]+)?)", re.M)


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


def test_the_package_has_modules():
    assert len(MODULES) > 50


@pytest.mark.parametrize("path", EVERY_MODULE, ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_no_module_over_600_lines(path):
    assert len(path.read_text().splitlines()) <= 600


def test_jax_and_jaxlib_are_imported_in_one_module():
    importers = {}
    for path in MODULES:
        for match in JAX_IMPORT.finditer(path.read_text()):
            module = (match.group(1) or match.group(3)) + (match.group(2) or match.group(4) or "")
            if not module.startswith("jaxlib.mlir"):
                importers.setdefault(_name(path), set()).add(module)
    assert set(importers) == {"runtime/jaxlib_api.py"}, importers


def _private_torch_uses(tree: ast.AST) -> set[str]:
    """Private torch modules imported (``torch._dynamo``, ``torch.fx._graph_pickler``),
    or ``torch._x`` reached as an attribute of ``torch``."""

    def private(module: str) -> bool:
        parts = module.split(".")
        return parts[0] == "torch" and any(part.startswith("_") for part in parts[1:])

    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and private(node.module or ""):
            used.add(node.module)
        elif isinstance(node, ast.Import):
            used.update(alias.name for alias in node.names if private(alias.name))
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch"
              and node.attr.startswith("_") and not node.attr.startswith("__")):
            used.add(f"torch.{node.attr}")
    return {name for name in used if not name.startswith("torch._ops")}


def test_private_torch_apis_are_used_in_one_module():
    users = {}
    for path in MODULES:
        used = _private_torch_uses(ast.parse(path.read_text()))
        if used:
            users[_name(path)] = used
    assert set(users) == {"torch_api.py"}, users
