#!/usr/bin/env bash
# The GPU machine's whole job in one script: install the wheels into a private folder, check
# the kernels against the Fermi subset, run the GPU tests, run the full-width benchmark.
# Figures and logs go to $OUT (default /tmp/fermium-gpu).
#   tools/gpu_suite.sh [WHEELS_DIR] [tests|bench|long|all]   (defaults: .whl, all)
# long: an 8k-token prompt through `fermium up` (cuda prefill, 6 GiB budget, CPU decode) on a
# 40-layer real-width file; it needs the serving wheels in WHEELS_DIR and the built CPU extension.
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
if [[ $WHAT == long ]]; then
    MODEL=${LONG_MODEL:-/tmp/syn40-q4_k_m.gguf}
    [[ -f $MODEL ]] || python3 tools/make_synthetic_gguf.py "$MODEL" --type q4_k_m --layers 40 --byte-tokenizer \
        > "$OUT/make_model.txt" 2>&1 || status=1
    for backend in ${LONG_BACKENDS:-cuda}; do
        FERMIUM_VRAM_BUDGET=${VRAM_BUDGET_GIB:-6} python3 tools/bench_up.py --model "$MODEL" --prompt "${LONG_PROMPT:-8192}" \
            --tokens 32 --backend "$backend" --requests 2 --json "$OUT/up_long_$backend.json" \
            > "$OUT/up_long_$backend.txt" 2>&1 || status=1
        grep "^request" "$OUT/up_long_$backend.txt"
    done
fi
exit $status
