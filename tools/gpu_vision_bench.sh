#!/usr/bin/env bash
# The vision tower on the GPU machine, in one run of about 8 minutes:
#   1. builds llama.cpp's llama-mtmd-cli with CUDA for this card from .cache/llcpp-src.tgz (in the
#      background, while 2 and 3 run);
#   2. writes the real-width synthetic f16 mmproj (tools/make_synthetic_mmproj.py), the 4-layer text
#      model as wide as its projection and the 1024x1024 image (tools/bench_vision.py's makers);
#   3. runs tests/gpu/test_cuda_vision.py and tests/gpu/test_cuda_vision_prefill.py;
#   4. once the build is done, times the image's encode REPS times each, alternating: llama-mtmd-cli
#      (all layers on the GPU; the encode time it logs) and Fermium's CUDA encoder
#      (tools/bench_cuda_vision.py; the first rep also checks the first block against the reference).
# Every command is printed (and kept in $OUT/commands.txt); logs, JSON and summary.txt go to $OUT.
#   tools/gpu_vision_bench.sh [REPS]      (default 3)
# Run from the repo copy with the wheels installed (tools/gpu_suite.sh's install; done here if pycuda
# is missing). Env: OUT (default /tmp/fermium-gpu-vision), JOBS (16), CUDA_ARCH (90), WORK (the files),
# LLDIR (the llama.cpp tree and build), MTMD (an llama-mtmd-cli already built), PY (python3),
# BUILD_LIMIT_S (360).
set -uo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
OUT=${OUT:-/tmp/fermium-gpu-vision}
WORK=${WORK:-/tmp/fermium-vision-files}
LLDIR=${LLDIR:-/tmp/fermium-llcpp}
JOBS=${JOBS:-16}
CUDA_ARCH=${CUDA_ARCH:-90}
SITE=${SITE:-/tmp/site}
PY=${PY:-python3}
BUILD_LIMIT_S=${BUILD_LIMIT_S:-360}      # past it the build stops, and only Fermium's encoder is timed
mkdir -p "$OUT" "$WORK" "$LLDIR" "$SITE"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

say() { echo "+ $*" | tee -a "$OUT/commands.txt"; }
run() { say "$@"; "$@"; }                 # prints the command, then runs it

if ! "$PY" -c "import pycuda" 2>/dev/null; then
    run "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
    [[ -f .cache/pydeps.tgz ]] && run tar xzf .cache/pydeps.tgz -C "$SITE"
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nvcc --version | tail -2
  cmake --version | head -1; "$PY" --version; nproc; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# ---- 1. llama-mtmd-cli with CUDA, in the background
MTMD=${MTMD:-$LLDIR/build/bin/llama-mtmd-cli}          # one already built skips the build
source tools/cuda_cublas.sh                  # CUBLAS_FLAGS for the llama.cpp build
[[ -n $CUBLAS_NOTE ]] && say "$CUBLAS_NOTE"
build_llama() {
    [[ -x $MTMD ]] && return 0
    run tar xzf .cache/llcpp-src.tgz -C "$LLDIR" || return 1
    run cmake -S "$LLDIR/llama.cpp" -B "$LLDIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH" -DGGML_CUDA_FA_ALL_QUANTS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF "${CUBLAS_FLAGS[@]}" || return 1
    run timeout "$BUILD_LIMIT_S" cmake --build "$LLDIR/build" --target llama-mtmd-cli -j "$JOBS"
}
T0=$SECONDS
build_llama > "$OUT/llama_build.txt" 2>&1 &
BUILD_PID=$!
say "llama.cpp build in the background (pid $BUILD_PID), log $OUT/llama_build.txt"

# ---- 2. the files
MMPROJ="$WORK/mmproj-f16.gguf"
TEXT="$WORK/text-2048.gguf"
IMAGE="$WORK/image-1024.png"
[[ -f $MMPROJ ]] || run "$PY" tools/make_synthetic_mmproj.py "$MMPROJ" --type f16 || status=1
[[ -f $TEXT ]] || run "$PY" -c "from pathlib import Path; from tools.bench_vision import text_model; \
text_model(Path('$TEXT'), 2048)" || status=1
[[ -f $IMAGE ]] || run "$PY" -c "from pathlib import Path; from tools.bench_vision import synthetic_png; \
synthetic_png(Path('$IMAGE'), 1024)" || status=1
ls -l "$MMPROJ" "$TEXT" "$IMAGE" | tee "$OUT/files.txt"

# ---- 3. the GPU vision tests (test_cuda_vision.py builds its tiny towers with torch + transformers)
TEST_PY=$PY
if ! "$PY" -c "import torch, transformers" 2>/dev/null && [[ -x /opt/torch/.venv/bin/python ]]; then
    TEST_PY=/opt/torch/.venv/bin/python                 # the same wheels in $SITE, on its own torch
    # its transformers pins its own huggingface_hub, which the one in $SITE would shadow
    rm -rf "$SITE"/huggingface_hub "$SITE"/huggingface_hub-*
fi
say "tests with $TEST_PY ($("$TEST_PY" --version 2>&1))"
run timeout 300 "$TEST_PY" -m pytest tests/gpu/test_cuda_vision.py tests/gpu/test_cuda_vision_prefill.py -q -p no:cacheprovider \
    -rs --durations=5 > "$OUT/gpu_vision_tests.txt" 2>&1 || status=1
tail -15 "$OUT/gpu_vision_tests.txt"

# ---- 4. encode times, alternating, once the build is done
say "waiting for the llama.cpp build"
if ! wait $BUILD_PID; then
    echo "llama.cpp build failed; see $OUT/llama_build.txt"
    tail -20 "$OUT/llama_build.txt"
    status=1
fi
echo "build done $((SECONDS - T0)) s after it began"
for rep in $(seq 1 "$REPS"); do
    if [[ -x $MTMD ]]; then
        run "$MTMD" -m "$TEXT" --mmproj "$MMPROJ" --image "$IMAGE" -p describe -n 1 -ngl 99 -c 4096 --temp 0 \
            --chat-template chatml -t "$JOBS" > "$OUT/llama_mtmd_$rep.txt" 2>&1 || status=1
        grep -E "encoding done in|slice encoded in" "$OUT/llama_mtmd_$rep.txt" || tail -5 "$OUT/llama_mtmd_$rep.txt"
    fi
    check=(); [[ $rep == 1 ]] && check=(--check)
    run "$PY" tools/bench_cuda_vision.py --mmproj "$MMPROJ" --image "$IMAGE" --encodes 3 "${check[@]}" \
        --json "$OUT/fermium_cuda_$rep.json" > "$OUT/fermium_cuda_$rep.txt" 2>&1 || status=1
    tail -1 "$OUT/fermium_cuda_$rep.txt"
done

# ---- summary
"$PY" - "$OUT" "$REPS" <<'EOF' | tee "$OUT/summary.txt"
import json, re, statistics, sys
from pathlib import Path
out, reps = Path(sys.argv[1]), int(sys.argv[2])
llama, first, best = [], [], []
for rep in range(1, reps + 1):
    log = out / f"llama_mtmd_{rep}.txt"
    m = re.search(r"(?:mtmd batch encoding done|image slice encoded) in (\d+) ms", log.read_text(errors="replace")) \
        if log.exists() else None
    if m:
        llama.append(int(m.group(1)) / 1000)
    f = out / f"fermium_cuda_{rep}.json"
    if f.exists():
        r = json.loads(f.read_text())
        first.append(r["encode_s"][0])
        best.append(r["best_s"])
        if "first_block_rel_err" in r:
            print(f"fermium cuda, first block against the reference: {r['first_block_rel_err']:.2e}; "
                  f"{r['patches']} patches, {r['tokens']} tokens on {r['device']}; device bytes {r['device_bytes']}")
def show(name, xs):
    if xs:
        print(f"{name:44s} " + " ".join(f"{x:.3f}" for x in xs) + f"  median {statistics.median(xs):.3f} s")
    else:
        print(f"{name:44s} no figures")
show("llama-mtmd-cli encode (its log), per rep", llama)
show("fermium cuda, first encode of the image", first)
show("fermium cuda, best of 3 encodes", best)
if llama and best:
    print(f"median llama-mtmd-cli / median fermium best: {statistics.median(llama) / statistics.median(best):.2f}x")
EOF
echo "all done $((SECONDS - T0)) s; exit $status"
exit $status
