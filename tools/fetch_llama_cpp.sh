#!/usr/bin/env bash
# Fetch a llama.cpp source tree (with convert_hf_to_gguf.py and its gguf-py) for the opt-in
# interop tests, from the llama-cpp-python sdist on PyPI, which vendors llama.cpp.
#
#   tools/fetch_llama_cpp.sh [DEST] [--build cpu|avx2|sse42|cuda]     (default DEST: .cache/llama-cpp)
#   export FERMIUM_LLAMA_CPP_DIR=$(tools/fetch_llama_cpp.sh)
#
# --build also compiles llama-bench, llama-batched-bench, llama-quantize and llama-imatrix into
# DEST's tree, under build-cpu/bin (-DGGML_NATIVE=ON: this CPU's ISA), build-avx2/bin (AVX2, FMA,
# F16C and BMI2 but no AVX-512: set against Fermium's --isa avx2), build-sse42/bin (no AVX of any
# kind, FMA, F16C or BMI2: its SSE4.2 path, set against Fermium's --isa ssse3) or build-cuda/bin
# (-DGGML_CUDA=ON for the GPU that is here, CMAKE_CUDA_ARCHITECTURES=native unless
# LLAMA_CPP_CUDA_ARCH says otherwise). LLAMA_CPP_JOBS sets the parallel jobs (default: nproc).
# DEST may also be a llama.cpp tree (e.g. the one printed before): then nothing is fetched.
# Prints the llama.cpp directory on stdout; everything else goes to stderr.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/.cache/llama-cpp"
BUILD=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --build) BUILD="${2:?--build needs cpu or cuda}"; shift 2 ;;
        *) DEST="$1"; shift ;;
    esac
done
[[ -z "$BUILD" || "$BUILD" == cpu || "$BUILD" == avx2 || "$BUILD" == sse42 || "$BUILD" == cuda ]] ||
    { echo "--build takes cpu, avx2, sse42 or cuda, not $BUILD" >&2; exit 2; }
PIP="${PIP:-$ROOT/.venv/bin/pip}"
TREE="$DEST/llama_cpp_python-$VERSION/vendor/llama.cpp"
[[ -f "$DEST/convert_hf_to_gguf.py" ]] && TREE="$DEST"     # DEST is a llama.cpp tree already: build there

if [[ ! -f "$TREE/convert_hf_to_gguf.py" ]]; then
    mkdir -p "$DEST"
    "$PIP" download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DEST" >&2
    tar -xzf "$DEST/llama_cpp_python-$VERSION.tar.gz" -C "$DEST"
fi
[[ -f "$TREE/convert_hf_to_gguf.py" ]] || { echo "no convert_hf_to_gguf.py under $TREE" >&2; exit 1; }
if [[ -n "$BUILD" ]]; then
    flags=(-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release)
    [[ "$BUILD" == cuda ]] && flags+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${LLAMA_CPP_CUDA_ARCH:-native}")
    [[ "$BUILD" == avx2 ]] && flags+=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_AVX512=OFF
        -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_SSE42=ON)
    [[ "$BUILD" == sse42 ]] && flags+=(-DGGML_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_AVX512=OFF
        -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF -DGGML_SSE42=ON)
    targets=(llama-bench llama-batched-bench llama-quantize llama-imatrix)
    missing=0
    for t in "${targets[@]}"; do [[ -x "$TREE/build-$BUILD/bin/$t" ]] || missing=1; done
    if [[ "$missing" == 1 ]]; then
        cmake -S "$TREE" -B "$TREE/build-$BUILD" "${flags[@]}" >&2
        cmake --build "$TREE/build-$BUILD" --target "${targets[@]}" -j "${LLAMA_CPP_JOBS:-$(nproc)}" >&2
    fi
fi
echo "$TREE"
