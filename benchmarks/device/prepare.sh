#!/usr/bin/env bash
# Here, before a device run: pack what the NVIDIA test machine lacks -- torch-mlir
# for its Python -- into .device/ (ignored by git), under the 64 MiB one run carries.
#
#   . .venv/bin/activate && bash benchmarks/device/prepare.sh [PYTHON_VERSION]   # default 3.12, the machine's
#
# torch-mlir's wheel is 80 MB, mostly debug symbols: stripped of them and packed
# with xz it is about 45 MB, so one call carries it with the tree (no split).
set -euo pipefail
cd "$(dirname "$0")/../.."
python_version=${1:-3.12}
version=$(sed -n 's/^torch-mlir==//p' constraints.txt)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -m pip download -q "torch-mlir==$version" --python-version "$python_version" \
    --only-binary=:all: --no-deps -d "$work/wheel"
python -m zipfile -e "$work"/wheel/*.whl "$work/site"
libs="$work/site/torch_mlir/_mlir_libs"
strip --strip-unneeded "$libs"/*.so "$libs/torch-mlir-opt"
chmod +x "$libs/torch-mlir-opt"  # zipfile drops the mode bits
mkdir -p .device
tar -C "$work/site" -cf - . | xz -T0 -6 > ".device/torch_mlir-py$python_version.tar.xz"
ls -l .device
