#!/usr/bin/env bash
# Fetch a llama.cpp source tree (with convert_hf_to_gguf.py and its gguf-py) for the opt-in
# interop tests, from the llama-cpp-python sdist on PyPI, which vendors llama.cpp.
#
#   tools/fetch_llama_cpp.sh [DEST]        (default DEST: .cache/llama-cpp)
#   export FERMIUM_LLAMA_CPP_DIR=$(tools/fetch_llama_cpp.sh)
#
# Prints the llama.cpp directory on stdout; everything else goes to stderr.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/.cache/llama-cpp}"
PIP="${PIP:-$ROOT/.venv/bin/pip}"
TREE="$DEST/llama_cpp_python-$VERSION/vendor/llama.cpp"

if [[ ! -f "$TREE/convert_hf_to_gguf.py" ]]; then
    mkdir -p "$DEST"
    "$PIP" download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DEST" >&2
    tar -xzf "$DEST/llama_cpp_python-$VERSION.tar.gz" -C "$DEST"
fi
[[ -f "$TREE/convert_hf_to_gguf.py" ]] || { echo "no convert_hf_to_gguf.py under $TREE" >&2; exit 1; }
echo "$TREE"
