#!/usr/bin/env bash
# The decode benchmark matrix on another host (e.g. the GPU machine's CPU): install the wheels
# into a private folder, build the native kernels in place, write the synthetic real-width
# models, then run `fermium bench decode` for each type, ISA, thread count and batch.
# Reports (JSON + text) go to $OUT (default /tmp/fermium-cpu). LAYERS sets the model depth
# (default 4): on a host whose last-level cache holds a good part of the 0.56 GB that a
# 4-layer model reads per token, more layers keep the figures honest. ISAS limits the ISAs,
# TYPES the model types (q4_0 q4_k_m). With PLAIN=1 each run is repeated with --no-repack
# right after it (the GGUF layout, for the ratio). MATRIX=0 skips that matrix. LLAMA_CPP_DIR, a
# llama.cpp source tree (tools/fetch_llama_cpp.sh), adds tools/vs_llama_cpp.py for each type and
# thread count: its native build against ours at batch 1 and 4 and on a prompt of PROMPT tokens
# (default 512), and its SSSE3-only build against --isa ssse3 (both built once under
# $LLAMA_BUILD, default /tmp/llama-cpp-build); LLAMA_CMP picks among "decode ssse3 prompt". With
# LLAMA_TYPES=1 too, tools/vs_llama_types.py runs over TYPES (its table and JSON in $OUT/vs-types).
#   tools/cpu_suite.sh [WHEELS_DIR] [THREADS...]     (defaults: .whl, 2 1)
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${1:-.whl}
shift || true
THREADS=${*:-2 1}
OUT=${OUT:-/tmp/fermium-cpu}
SITE=${SITE:-/tmp/site}
MODELS=${MODELS:-/tmp/fermium-models}
LAYERS=${LAYERS:-4}
TYPES=${TYPES:-q4_0 q4_k_m}
mkdir -p "$OUT" "$MODELS"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import sys; sys.path.insert(0, 'native/cpu'); import build; build.ffibuilder.compile(tmpdir='.', verbose=False)" \
    > "$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; exit 1; }
lscpu > "$OUT/lscpu.txt"
# every kernel of every ISA this CPU runs, against its generic sibling (and the batched ones
# against the row ones), then the kernel tests where pytest is installed
cc -O2 -Inative/cpu native/cpu/selftest/selftest.c native/cpu/{dispatch,quantize,repack,ops}.c native/cpu/*_generic.c \
    build/native_cpu_isa/*.o -lm -o "$OUT/selftest.bin" && "$OUT/selftest.bin" > "$OUT/selftest.txt"
tail -5 "$OUT/selftest.txt"; rm -f "$OUT/selftest.bin"
if python3 -c "import pytest" 2> /dev/null; then
    python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_repack.py > "$OUT/kernel_tests.txt" 2>&1; tail -1 "$OUT/kernel_tests.txt"
fi
LLAMA_BUILD=${LLAMA_BUILD:-/tmp/llama-cpp-build}
mkdir -p "$LLAMA_BUILD"
build_llama_cpp() {   # build dir, then cmake options; both builds run beside the model writing
    [[ -x $1/bin/llama-batched-bench ]] && return
    cmake -S "$LLAMA_CPP_DIR" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF "${@:2}" > "$1.log" 2>&1 &&
        cmake --build "$1" --target llama-batched-bench -j "$(( $(nproc) / 2 ))" >> "$1.log" 2>&1 || tail -5 "$1.log"
}
if [[ ${LLAMA_CPP_DIR:-} ]]; then
    build_llama_cpp "$LLAMA_BUILD/native" -DGGML_NATIVE=ON &
    build_llama_cpp "$LLAMA_BUILD/ssse3" -DGGML_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_AVX512=OFF \
        -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF -DGGML_SSE42=ON &
fi
for type in $TYPES; do   # written side by side
    model=$MODELS/syn-$type-L$LAYERS.gguf
    [[ -f $model ]] || python3 tools/make_synthetic_gguf.py "$model" --type $type --layers "$LAYERS" > /dev/null &
done
wait
ISAS=${ISAS:-$(python3 -c "from native import cpu_lib; print(' '.join(cpu_lib.supported_isas()[1:]))")}
bench() {   # name, then the bench arguments
    local name=$1; shift
    python3 -m fermium bench decode "$@" --rounds 3 --tokens 12 --json > "$OUT/$name.json" 2> "$OUT/$name.err" &&
        python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], f\"{r['median_tok_s']:.2f} tok/s\", f\"{100*r['median_bw_ratio']:.1f}%\", f\"best {100*r['best']['bw_ratio']:.1f}%\", f\"batch gain {r['median_batch_gain']:.2f}x\" if 'median_batch_gain' in r else '')" "$OUT/$name.json" "$name" | tee -a "$OUT/summary.txt"
}
for type in $TYPES; do
    for t in $THREADS; do
        [[ ${MATRIX:-1} == 0 ]] && continue
        for isa in $ISAS; do
            bench "$type-$isa-t$t" --model "$MODELS/syn-$type-L$LAYERS.gguf" --threads "$t" --isa "$isa"
            [[ ${PLAIN:-} ]] && bench "$type-$isa-t$t-plain" --model "$MODELS/syn-$type-L$LAYERS.gguf" --threads "$t" --isa "$isa" --no-repack
        done
        bench "$type-b4-t$t" --model "$MODELS/syn-$type-L$LAYERS.gguf" --threads "$t" --batch 4
        [[ ${PLAIN:-} ]] && bench "$type-b4-t$t-plain" --model "$MODELS/syn-$type-L$LAYERS.gguf" --threads "$t" --batch 4 --no-repack
    done
done
for type in ${LLAMA_CPP_DIR:+$TYPES}; do
    for t in $THREADS; do
        model=$MODELS/syn-$type-L$LAYERS.gguf
        for cmp in ${LLAMA_CMP:-decode ssse3 prompt}; do
            case $cmp in
                decode) args=(native --batch 4) ;;
                ssse3) args=(ssse3 --isa ssse3) ;;
                prompt) args=(native --prompt "${PROMPT:-512}") ;;
            esac
            python3 tools/vs_llama_cpp.py --batched-bench "$LLAMA_BUILD/${args[0]}/bin/llama-batched-bench" \
                --model "$model" --threads "$t" --reps 2 "${args[@]:1}" | tee -a "$OUT/summary.txt"
        done
    done
done
if [[ ${LLAMA_CPP_DIR:-} && ${LLAMA_TYPES:-} ]]; then
    python3 tools/vs_llama_types.py --llama-cpp "$LLAMA_CPP_DIR" --types $TYPES --layers "$LAYERS" --models "$MODELS" \
        --out "$OUT/vs-types" --max-busy 0.3 > "$OUT/vs-types.txt" 2>&1; tee -a "$OUT/summary.txt" < "$OUT/vs-types/table.md"
fi
# one archive instead of many small files, for hosts that hand back only a few
reports=$(cd "$OUT" && ls ./*.json ./*.err 2> /dev/null)
[[ $reports ]] && tar czf "$OUT/reports.tgz" -C "$OUT" $reports && (cd "$OUT" && rm -f ./*.json ./*.err)
