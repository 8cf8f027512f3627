#!/usr/bin/env bash
# On the lent NVIDIA machine, from the root of the tree the device tool copied:
# make the torch-mlir packed by prepare.sh and this tree importable (nothing is
# installed: the machine has no network), say what the backend finds, then run
# benchmarks/gpu_check.py. Through the device tool, carrying .device/torch_mlir-py3.12.tar.xz:
#
#   BENCHMARK_COMMIT=<commit> bash benchmarks/device/run.sh [gpu_check.py options]
#   bash benchmarks/device/run.sh perf [perf.py options]   # perf.py on the machine's 16 CPU cores (issue 21)
#
# Results land in $OUT (the folder the tool brings back), or benchmarks/results.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
python_version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
site=$(mktemp -d)
xz -dc ".device/torch_mlir-py$python_version.tar.xz" | tar -C "$site" -xf -
# backend="tpu" comes from an entry point: a dist-info beside torch-mlir declares it.
dist="$site/tpu_inductor-0+device.dist-info"
mkdir -p "$dist"
printf 'Metadata-Version: 2.1\nName: tpu_inductor\nVersion: 0+device\n' > "$dist/METADATA"
printf '[torch_dynamo_backends]\ntpu = tpu_inductor.backend:tpu_backend\n' > "$dist/entry_points.txt"
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
out=${OUT:-benchmarks/results}
mkdir -p "$out"
"$python" -m tpu_inductor.cli doctor 2>&1 | tee "$out/doctor.txt" || true
if [ "${1:-}" = perf ]; then
    shift
    # 10 rounds, not 20: each path in its own process, the whole run took
    # ~10.5 min with 20 on this project's 2-core machine; a command gets 10.
    exec "$python" benchmarks/perf.py --json "$out/perf-cpu.json" --rounds 10 "$@"
fi
status=0
"$python" benchmarks/gpu_check.py --out "$out/gpu_check.json" "$@" || status=$?
cp benchmarks/results/generate-cuda.json "$out/" 2>/dev/null || true
exit $status
