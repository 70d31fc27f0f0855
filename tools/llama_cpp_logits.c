// llama_cpp_logits: load a GGUF file with llama.cpp (libllama) and print, for given token ids,
// the last position's logits and a few greedy continuation tokens. It checks that a file
// written by `fermium convert` loads in llama.cpp and computes what Fermium computes.
// It is not part of Fermium: it is built against a llama.cpp tree (tools/fetch_llama_cpp.sh).
//
//   cmake -S $LLAMA -B build -G Ninja -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF \
//         -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
//         -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_OPENMP=OFF
//   ninja -C build llama
//   cc -O2 tools/llama_cpp_logits.c -I$LLAMA/include -I$LLAMA/ggml/include build/src/libllama.a \
//      build/ggml/src/libggml.a build/ggml/src/libggml-cpu.a build/ggml/src/libggml-base.a \
//      -lstdc++ -lm -lpthread -o llama_cpp_logits
// or against the shared libraries that `tools/fetch_llama_cpp.sh DEST --build cpu` builds:
//   cc -O2 tools/llama_cpp_logits.c -I$LLAMA/include -I$LLAMA/ggml/include -L$LLAMA/build-cpu/bin \
//      -lllama -lggml -lggml-base -Wl,-rpath,$LLAMA/build-cpu/bin -o llama_cpp_logits
//   ./llama_cpp_logits model.gguf 5,6,7,8 8      -> "logits v0 v1 ..." then "greedy t0 t1 ...",
//   then "step1 v0 v1 ..." to "step7 ...": the logits that chose t1 to t7 (those of t0 are "logits")
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define MAX_TOKENS 512

static int parse_tokens(const char * s, llama_token * out) {
    int n = 0;
    while (*s && n < MAX_TOKENS) {
        out[n++] = (llama_token) strtol(s, (char **) &s, 10);
        if (*s == ',') s++;
    }
    return n;
}

static int argmax(const float * x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf TOKEN,TOKEN,... [N_GREEDY]\n", argv[0]);
        return 2;
    }
    llama_token tokens[MAX_TOKENS];
    int n_tokens = parse_tokens(argv[2], tokens);
    int n_greedy = argc > 3 ? atoi(argv[3]) : 8;

    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "%s: llama.cpp could not load the model\n", argv[1]); return 1; }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = MAX_TOKENS + 64;
    cp.n_batch = MAX_TOKENS;
    cp.n_threads = cp.n_threads_batch = 4;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "%s: no context\n", argv[1]); return 1; }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    if (llama_decode(ctx, llama_batch_get_one(tokens, n_tokens))) { fprintf(stderr, "decode failed\n"); return 1; }
    const float * logits = llama_get_logits_ith(ctx, -1);
    printf("logits");
    for (int i = 0; i < n_vocab; i++) printf(" %.9g", logits[i]);
    printf("\ngreedy");
    float * steps = malloc(sizeof(float) * (size_t) n_vocab * (n_greedy > 0 ? n_greedy : 1));
    if (!steps) { fprintf(stderr, "out of memory\n"); return 1; }
    for (int s = 0; s < n_greedy; s++) {
        const float * step = llama_get_logits_ith(ctx, -1);
        memcpy(steps + (size_t) s * n_vocab, step, sizeof(float) * n_vocab);
        llama_token t = argmax(step, n_vocab);
        printf(" %d", t);
        if (llama_decode(ctx, llama_batch_get_one(&t, 1))) { fprintf(stderr, "decode failed\n"); return 1; }
    }
    printf("\n");
    for (int s = 1; s < n_greedy; s++) {
        printf("step%d", s);
        for (int i = 0; i < n_vocab; i++) printf(" %.9g", steps[(size_t) s * n_vocab + i]);
        printf("\n");
    }
    free(steps);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
