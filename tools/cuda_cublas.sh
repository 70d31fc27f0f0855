# Sourced by the GPU scripts before a llama.cpp CUDA build. ggml-cuda links cuBLAS; a toolkit
# without it takes the first one found elsewhere (a pip nvidia wheel beside torch, say): its library
# and headers go to cmake in CUBLAS_FLAGS and its folder onto LD_LIBRARY_PATH; CUBLAS_NOTE says what
# was chosen (empty when the toolkit has its own).
CUBLAS_FLAGS=()
CUBLAS_NOTE=""
if ! compgen -G "${CUDA_HOME:-/usr/local/cuda}/include/cublas_v2.h" > /dev/null \
        && ! compgen -G "/usr/local/cuda*/targets/*/include/cublas_v2.h" > /dev/null \
        && ! compgen -G "/usr/local/cuda*/include/cublas_v2.h" > /dev/null; then
    inc=$(find /opt /usr/local /usr/lib /usr/include -name cublas_v2.h 2>/dev/null | head -1)
    [[ -n $inc ]] && inc=$(dirname "$inc")
    lib=$([[ -n $inc ]] && find "$inc/../lib" "$inc/../lib64" -name 'libcublas.so*' 2>/dev/null | head -1)
    if [[ -n $lib ]]; then
        lt=$(find "$(dirname "$lib")" -name 'libcublasLt.so*' | head -1)
        CUBLAS_FLAGS=("-DCUDA_cublas_LIBRARY=$lib" "-DCUDA_cublasLt_LIBRARY=$lt" "-DCMAKE_CUDA_FLAGS=-I$inc"
                      "-DCMAKE_CXX_FLAGS=-I$inc")
        export LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        CUBLAS_NOTE="no cuBLAS in the CUDA toolkit; using $lib ($inc)"
    else
        CUBLAS_NOTE="no cuBLAS in the CUDA toolkit nor elsewhere: the llama.cpp CUDA build will fail"
    fi
fi
