#!/usr/bin/env bash
# The GPU machine's whole job in one script: install the wheels into a private folder, check
# the kernels against the Fermi subset, run the GPU tests, run the full-width benchmark.
# Figures and logs go to $OUT (default /tmp/fermium-gpu).
#   tools/gpu_suite.sh [WHEELS_DIR] [tests|bench|all]   (defaults: .whl, all)
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${1:-.whl}
WHAT=${2:-all}
OUT=${OUT:-/tmp/fermium-gpu}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
if [[ $WHAT == all || $WHAT == tests ]]; then
    python3 tools/check_fermi_subset.py > "$OUT/fermi_subset.txt" 2>&1 || status=1
    tail -1 "$OUT/fermi_subset.txt"
    python3 -m pytest tests/gpu -q -p no:cacheprovider --durations=10 > "$OUT/gpu_tests.txt" 2>&1 || status=1
    tail -25 "$OUT/gpu_tests.txt"
fi
if [[ $WHAT == all || $WHAT == bench ]]; then
    python3 tools/bench_cuda_prefill.py --budget 6GiB --prompts 947 4096 --out "$OUT/bench.json" \
        2>&1 | tee "$OUT/bench.txt" || status=1
fi
exit $status
