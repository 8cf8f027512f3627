"""torch-mlir's end-to-end suite, imported from a source checkout (for torch_mlir_e2e.py).

The suite is not part of the torch-mlir wheel: ``--suite-dir`` points at a
checkout of llvm/torch-mlir at ``PINNED_COMMIT``. What the suite imports but
its tests here do not need (``multiprocess``, ``torchvision``, the checkout's
``torch_mlir._version``) gets a stand-in, listed in the results' meta.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

# The torch-mlir wheel here is version 20261001 (a nightly date); wheels name
# no source commit. Its libraries say they were built from LLVM
# 10dbfc4863c9aea2fb237022c3f47fc24c02265e ("LLVM 24.0.0git (10dbfc48...)" in
# libTorchMLIRAggregateCAPI.so), which torch-mlir's externals/llvm-project
# took at 5f9e4a30 (2026-08-13, "Integrate LLVM at 10dbfc48") and still has at
# 0029fc2e (2026-08-20), the newest commit available to us. The wheel's Python
# files (fx_importer.py: uint32, graph_node_importer_cls) are newer still than
# 0029fc2e, so the wheel was built after it from the same LLVM: 0029fc2e is
# the closest commit we can pin, and the suite there matches the wheel's
# lowering within a few weeks of torch-mlir changes.
PINNED_COMMIT = "0029fc2e102c6d604696b33eb618116b4957a2e3"
WHEEL_LLVM_COMMIT = "10dbfc4863c9aea2fb237022c3f47fc24c02265e"
COMMIT_FILE = "TORCH_MLIR_COMMIT"
SUITE_ENV = "TORCH_MLIR_E2E_SUITE_DIR"
XFAIL_SETS = ("FX_IMPORTER_STABLEHLO_XFAIL_SET", "FX_IMPORTER_STABLEHLO_CRASHING_SET")


class _Missing(types.ModuleType):
    """A module that is not installed: importable, failing on first use."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ModuleNotFoundError(f"{self.__name__.split('.')[0]} is not installed (stand-in module)")


def _stand_ins() -> list[str]:
    """Put stand-ins for what the suite imports but the tests here do not need."""
    added = []
    try:
        import multiprocess  # noqa: F401
    except ImportError:
        # framework.py imports it for its process pool (run_tests), which is not used here.
        module = types.ModuleType("multiprocess")
        module.cpu_count = os.cpu_count
        module.set_start_method = lambda *args, **kwargs: None
        sys.modules["multiprocess"] = module
        added.append("multiprocess")
    try:
        import torchvision  # noqa: F401
    except ImportError:
        # vision_models.py and conv.py import it at module level; their tests fail in eager.
        package = _Missing("torchvision")
        package.__path__ = []
        for sub in ("models", "ops"):
            setattr(package, sub, _Missing(f"torchvision.{sub}"))
            sys.modules[f"torchvision.{sub}"] = getattr(package, sub)
        sys.modules["torchvision"] = package
        added.append("torchvision")
    return added


def _python_dir(suite_dir: Path) -> Path:
    return suite_dir / "projects" / "pt1" / "python"


def suite_commit(suite_dir: Path) -> tuple[str, str]:
    """(commit, how it was found) of the checkout at ``suite_dir``."""
    try:
        result = subprocess.run(["git", "-C", str(suite_dir), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=30)
        if result.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", result.stdout.strip()):
            return result.stdout.strip(), "git rev-parse HEAD"
    except (OSError, subprocess.SubprocessError):
        pass
    marker = suite_dir / COMMIT_FILE
    if marker.exists():
        return marker.read_text().strip(), COMMIT_FILE
    return "unknown", "no git checkout and no TORCH_MLIR_COMMIT file"


def import_suite(suite_dir: Path) -> tuple[dict, dict, list[str]]:
    """``({name: Test}, {xfail set name: set of names}, stand-ins used)``."""
    python_dir = _python_dir(suite_dir)
    if not (python_dir / "torch_mlir_e2e_test").is_dir():
        raise SystemExit(f"{python_dir / 'torch_mlir_e2e_test'} not found: --suite-dir must be a torch-mlir checkout")
    added = _stand_ins()
    # Appended, not prepended: the installed wheel's torch_mlir modules win over
    # same-named files of the checkout (torch_mlir is a namespace package, so
    # the checkout's projects/pt1/python/torch_mlir/_version.py joins it).
    sys.path.append(str(python_dir))
    try:
        import torch_mlir._version  # noqa: F401
    except ImportError:
        from packaging import version as packaging_version

        import torch

        shim = types.ModuleType("torch_mlir._version")
        shim.version = packaging_version
        shim.torch_version_for_comparison = lambda: packaging_version.parse(torch.__version__.split("+", 1)[0])
        sys.modules["torch_mlir._version"] = shim
        added.append("torch_mlir._version")
    from torch_mlir_e2e_test.registry import GLOBAL_TEST_REGISTRY
    from torch_mlir_e2e_test.test_suite import register_all_tests

    if not GLOBAL_TEST_REGISTRY:
        register_all_tests()
    tests = {test.unique_name: test for test in GLOBAL_TEST_REGISTRY}
    xfails: dict[str, set] = {}
    path = suite_dir / "projects" / "pt1" / "e2e_testing" / "xfail_sets.py"
    if path.exists():
        spec = importlib.util.spec_from_file_location("torch_mlir_e2e_xfail_sets", path)
        module = importlib.util.module_from_spec(spec)
        with contextlib.redirect_stdout(io.StringIO()):  # it prints the torch version
            spec.loader.exec_module(module)
        xfails = {name: set(getattr(module, name, set())) for name in XFAIL_SETS}
    return tests, xfails, added
