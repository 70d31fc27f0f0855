#!/usr/bin/env bash
# Issue 41's GPU figures in one call of under 10 minutes: installs the wheels, writes the 40-layer
# real-width files of the given types in the background (tools/make_synthetic_gguf.py, llama-quantize's
# mixes), meanwhile checks the Fermi subset and runs the GPU tests of every weight type, then times
# the cuda prefill of each file under a 6 GiB budget (`fermium bench prefill --model`: tok/s, overlap).
#   tools/gpu_types_bench.sh [TYPES...]        (default: iq2_xxs q3_k_m)
# Env: OUT (default /tmp/fermium-types-out), WORK (the files; /tmp/fermium-types), PY (python3),
# TESTS (a pytest -k selection of tests/gpu; default all of it), TEST_LIMIT_S (300), FERMI (0: skip the
# subset check, which CI runs too), BENCH_LIMIT_S (each file's bench; 150).
set -uo pipefail
cd "$(dirname "$0")/.."
TYPES=${*:-iq2_xxs q3_k_m}
OUT=${OUT:-/tmp/fermium-types-out}
WORK=${WORK:-/tmp/fermium-types}
SITE=${SITE:-/tmp/site}
PY=${PY:-python3}
mkdir -p "$OUT" "$WORK" "$SITE"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
say() { echo "+ $*" | tee -a "$OUT/commands.txt"; }

"$PY" -c "import pycuda, tokenizers" 2>/dev/null || "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; df -h /tmp | tail -1; } > "$OUT/machine.txt" 2>&1
for t in $TYPES; do
    f="$WORK/syn40-$t.gguf"
    [[ -f $f ]] && continue
    say "$PY" tools/make_synthetic_gguf.py "$f" --type "$t" --layers 40 --byte-tokenizer
    ( "$PY" tools/make_synthetic_gguf.py "$f.part" --type "$t" --layers 40 --byte-tokenizer > "$OUT/make_$t.txt" 2>&1 \
        && mv "$f.part" "$f" ) &
done
if [[ ${FERMI:-1} == 1 ]]; then
    say "$PY" tools/check_fermi_subset.py
    "$PY" tools/check_fermi_subset.py > "$OUT/fermi_subset.txt" 2>&1 || status=1
    tail -1 "$OUT/fermi_subset.txt"
fi
say "$PY" -m pytest tests/gpu -q -p no:cacheprovider ${TESTS:+-k "$TESTS"}
timeout "${TEST_LIMIT_S:-300}" "$PY" -m pytest tests/gpu -q -p no:cacheprovider ${TESTS:+-k "$TESTS"} \
    > "$OUT/gpu_tests.txt" 2>&1 || status=1
tail -15 "$OUT/gpu_tests.txt"
wait
for t in $TYPES; do
    f="$WORK/syn40-$t.gguf"
    [[ -f $f ]] || { echo "no $f: $(tail -3 "$OUT/make_$t.txt")"; status=1; continue; }
    ls -l "$f" >> "$OUT/machine.txt"
    say "$PY" -m fermium bench prefill --model "$f" --budget 6GiB --prompt 947 --prompt 4096
    timeout "${BENCH_LIMIT_S:-150}" "$PY" -m fermium bench prefill --model "$f" --budget 6GiB --prompt 947 --prompt 4096 \
        2>&1 | tee "$OUT/bench_$t.txt" || status=1
done
exit $status
