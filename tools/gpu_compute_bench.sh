#!/usr/bin/env bash
# Issue 33's figures on the GPU machine, in two calls of under 10 minutes, the second at once
# after the first (the machine keeps /tmp while it stays warm):
#   tools/gpu_compute_bench.sh build     installs the wheels; builds llama.cpp's llama-bench with CUDA
#       for this card from .cache/llcpp-src.tgz in the background (capped at BUILD_LIMIT_S) while it
#       writes the 40-layer real-width Q4_K_M file (tools/make_synthetic_gguf.py --byte-tokenizer, as
#       both llama.cpp and `fermium up` load it), checks the Fermi subset and runs tests/gpu.
#       Run again, it resumes what is missing (SKIP_TESTS=1 skips the tests).
#   tools/gpu_compute_bench.sh measure   the GEMMs against fp32 peak (tools/bench_cuda_gemm.py), then,
#       alternating, `fermium bench prefill --model FILE` and llama-bench -ngl 0 (its default batches,
#       and -ub 4096 -b 4096) on that file (its second Fermium run with --phases: where the compute
#       time goes, phase by phase), then the synthetic prefill; summary.txt holds the goals.
# Every command is printed (and kept in $OUT/commands.txt); all logs go to $OUT/log.txt.
# Env: OUT (default /tmp/fermium-compute-out), WORK (the file; /tmp/fermium-compute), LLDIR (the
# llama.cpp tree and build; /tmp/fermium-llcpp), LLAMA_BENCH (one already built), JOBS (16),
# CUDA_ARCH (90), PY (python3), BUILD_LIMIT_S (480), MEASURE_LIMIT_S (560: the measure phase's
# steps are cut or skipped to end by then), GEMM_SOURCE (an old gemm.cu to compare, name=PATH[:BMxBN]).
set -uo pipefail
cd "$(dirname "$0")/.."
PHASE=${1:-}
[[ $PHASE == build || $PHASE == measure ]] || { echo "usage: tools/gpu_compute_bench.sh build|measure" >&2; exit 2; }
OUT=${OUT:-/tmp/fermium-compute-out}
WORK=${WORK:-/tmp/fermium-compute}
LLDIR=${LLDIR:-/tmp/fermium-llcpp}
JOBS=${JOBS:-16}
CUDA_ARCH=${CUDA_ARCH:-90}
SITE=${SITE:-/tmp/site}
PY=${PY:-python3}
BUILD_LIMIT_S=${BUILD_LIMIT_S:-480}
MEASURE_LIMIT_S=${MEASURE_LIMIT_S:-560}
MODEL="$WORK/syn40-q4_k_m.gguf"
LLAMA_BENCH=${LLAMA_BENCH:-$LLDIR/build/bin/llama-bench}
LOG="$OUT/log.txt"
mkdir -p "$OUT" "$WORK" "$LLDIR" "$SITE"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
T0=$SECONDS

say() { echo "+ $*" | tee -a "$OUT/commands.txt"; }
run() { say "$@"; "$@"; }                 # prints the command, then runs it
note() { echo "$*" | tee -a "$LOG"; }

if ! "$PY" -c "import pycuda" 2>/dev/null; then
    run "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
    [[ -f .cache/pydeps.tgz ]] && run tar xzf .cache/pydeps.tgz -C "$SITE"
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; nvcc --version | tail -2
  cmake --version | head -1; "$PY" --version; nproc; free -g | head -2; df -h /tmp | tail -1; } >> "$LOG" 2>&1

source tools/cuda_cublas.sh                  # CUBLAS_FLAGS for the llama.cpp build
[[ -n $CUBLAS_NOTE ]] && note "$CUBLAS_NOTE"
until_limit() { local s=$((BUILD_LIMIT_S - (SECONDS - T0))); echo $(( s > 10 ? s : 10 )); }

# ---- phase build
build_llama() {
    [[ -x $LLAMA_BENCH ]] && return 0
    [[ -f $LLDIR/llama.cpp/CMakeLists.txt ]] || run tar xzf .cache/llcpp-src.tgz -C "$LLDIR" || return 1
    if [[ ! -f $LLDIR/build/CMakeCache.txt ]]; then
        run cmake -S "$LLDIR/llama.cpp" -B "$LLDIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
            "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF "${CUBLAS_FLAGS[@]}" || return 1
    fi
    run timeout "$(until_limit)" cmake --build "$LLDIR/build" --target llama-bench -j "$JOBS"
}
make_model() {         # into a temporary name first: a write cut short leaves no file
    [[ -f $MODEL ]] && return 0
    run timeout "$(until_limit)" "$PY" tools/make_synthetic_gguf.py "$MODEL.part" --type q4_k_m --layers 40 \
        --byte-tokenizer && mv "$MODEL.part" "$MODEL"
}
phase_build() {
    local build_pid model_pid test_py=$PY
    build_llama > "$WORK/llama_build.txt" 2>&1 &
    build_pid=$!
    say "llama.cpp build in the background (pid $build_pid), log $WORK/llama_build.txt"
    make_model > "$WORK/make_model.txt" 2>&1 &
    model_pid=$!
    say "writing $MODEL in the background (pid $model_pid)"
    run "$PY" tools/check_fermi_subset.py > "$OUT/fermi_subset.txt" 2>&1 || status=1
    tail -3 "$OUT/fermi_subset.txt"
    if [[ ${SKIP_TESTS:-0} != 1 ]]; then
        if ! "$PY" -c "import torch, transformers" 2>/dev/null && [[ -x /opt/torch/.venv/bin/python ]]; then
            test_py=/opt/torch/.venv/bin/python             # the same wheels in $SITE, on its own torch
            # its transformers pins its own huggingface_hub, which the one in $SITE would shadow
            rm -rf "$SITE"/huggingface_hub "$SITE"/huggingface_hub-*
        fi
        say "tests with $test_py ($("$test_py" --version 2>&1))"
        run timeout "$(until_limit)" "$test_py" -m pytest tests/gpu -q -p no:cacheprovider -rs \
            --durations=10 > "$OUT/gpu_tests.txt" 2>&1 || status=1
        tail -25 "$OUT/gpu_tests.txt"
    fi
    say "waiting for the model file and the llama.cpp build"
    wait "$model_pid" || { status=1; rm -f "$MODEL.part"; }
    cat "$WORK/make_model.txt" >> "$LOG"
    wait "$build_pid" || status=1
    cat "$WORK/llama_build.txt" >> "$LOG"
    {
        echo "phase build: $((SECONDS - T0)) s, exit $status"
        ls -l "$MODEL" 2>&1
        if [[ -x $LLAMA_BENCH ]]; then echo "llama-bench built: $LLAMA_BENCH"
        else echo "llama-bench missing: run the build phase again (it resumes); its log ends:"
             tail -5 "$WORK/llama_build.txt"
        fi
        tail -1 "$OUT/fermi_subset.txt"
        [[ -f $OUT/gpu_tests.txt ]] && tail -1 "$OUT/gpu_tests.txt"
    } 2>&1 | tee "$OUT/summary.txt"
}

# ---- phase measure
left() { echo $((MEASURE_LIMIT_S - (SECONDS - T0) - 20)); }      # 20 s kept for the summary
step() {               # step NAME CAP_S MIN_S CMD...: CMD under the smaller of CAP_S and the time left,
    local name=$1 cap=$2 min=$3 rest rc to=${TO:-$LOG}   # its stdout to $TO (default the log)
    shift 3
    rest=$(left)
    if (( rest < min )); then note "skipped $name: $rest s left, it needs $min"; return 0; fi
    (( cap < rest )) || cap=$rest
    note "---- $name ($((SECONDS - T0)) s in)"
    say timeout "$cap" "$@" ">> $to"
    timeout "$cap" "$@" >> "$to" 2>> "$LOG"
    rc=$?
    (( rc == 0 )) || { status=1; note "$name: exit $rc"; }
}
fermium_file() {       # fermium_file ROUND [more options]
    local round=$1; shift
    step "fermium file $round" 180 60 "$PY" -m fermium bench prefill --model "$MODEL" --budget 6GiB \
        --prompt 947 --prompt 4096 "$@" --out "$OUT/prefill-file-$round.json"
}
llama() {              # llama NAME [batch options]: appends its jsonl rows to llama.jsonl
    local name=$1; shift
    [[ -x $LLAMA_BENCH ]] || { note "skipped llama-bench $name: no $LLAMA_BENCH (phase build first)"; return 0; }
    TO="$OUT/llama.jsonl" step "llama-bench $name" 240 40 \
        "$LLAMA_BENCH" -m "$MODEL" -ngl 0 -p 947,4096 -n 0 -r 2 "$@" -o jsonl -oe md
}
phase_measure() {
    [[ -f $MODEL ]] || { note "no $MODEL: run the build phase first"; exit 1; }
    local source=(); [[ -n ${GEMM_SOURCE:-} ]] && source=(--source "$GEMM_SOURCE")
    step "GEMMs" 150 40 "$PY" tools/bench_cuda_gemm.py --tokens 947 4096 "${source[@]}" --out "$OUT/gemm.json"
    fermium_file 1 --compare-staging
    llama "default batches"
    llama "-ub 4096 -b 4096" -ub 4096 -b 4096
    fermium_file 2 --phases
    llama "-ub 4096 -b 4096, again" -ub 4096 -b 4096
    step "fermium synthetic" 150 80 "$PY" -m fermium bench prefill --budget 6GiB --prompt 947 --prompt 4096 \
        --out "$OUT/prefill-synthetic.json"
    say "$PY" tools/gpu_compute_summary.py "$OUT"
    "$PY" tools/gpu_compute_summary.py "$OUT" 2>> "$LOG" | tee "$OUT/summary.txt" || status=1
    echo "phase measure: $((SECONDS - T0)) s, exit $status" | tee -a "$OUT/summary.txt"
}

"phase_$PHASE"
exit $status
