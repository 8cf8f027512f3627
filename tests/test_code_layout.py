"""The rules of the package's layout that a reviewer would otherwise check by hand.

* No module over 600 lines: a module has one job.
* Every jax and jaxlib call goes through ``runtime/jaxlib_api.py``, where the
  differences between the jax releases it supports are handled (MLIR's own
  bindings, ``jaxlib.mlir``, excepted: they edit modules, they are not jax's API).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tpu_inductor"
MODULES = sorted(PACKAGE.rglob("*.py"))
JAX_IMPORT = re.compile(r"^\s*(?:from\s+(jaxlib|jax)(\.[\w.]+)?\s+import|import\s+(jaxlib|jax)(\.[\w.]+)?)", re.M)


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


def test_the_package_has_modules():
    assert len(MODULES) > 50


@pytest.mark.parametrize("path", MODULES, ids=_name)
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
