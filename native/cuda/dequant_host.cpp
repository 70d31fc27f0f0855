// dequant_host.cpp: run the kernels' block decoders on the CPU, for tests.
// Not a kernel: a host program built by tests against quant.cuh, so the decoders can be
// checked against gguf's numpy dequantizer on a machine without a GPU.
//   dequant_host TYPE N_ELEMENTS < blocks > float32 values
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "quant.cuh"

typedef void (*Decoder)(const unsigned char*, int, float*);

struct Entry { const char* name; Decoder fn; int block; int bytes; };

static const Entry TABLE[] = {
    {"F32", dq8_f32, 1, 4},      {"F16", dq8_f16, 1, 2},       {"BF16", dq8_bf16, 1, 2},
    {"Q8_0", dq8_q8_0, 32, 34},  {"Q4_0", dq8_q4_0, 32, 18},   {"Q4_K", dq8_q4_k, 256, 144},
    {"Q5_K", dq8_q5_k, 256, 176}, {"Q6_K", dq8_q6_k, 256, 210},
};

int main(int argc, char** argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s TYPE N_ELEMENTS < blocks > floats\n", argv[0]); return 2; }
    const Entry* e = 0;
    for (const Entry& t : TABLE) if (!strcmp(t.name, argv[1])) e = &t;
    long n = atol(argv[2]);
    if (!e || n % 256) { fprintf(stderr, "unknown type %s or N not a multiple of 256\n", argv[1]); return 2; }
    std::vector<unsigned char> raw(n / e->block * e->bytes);
    if (fread(raw.data(), 1, raw.size(), stdin) != raw.size()) { fprintf(stderr, "short input\n"); return 2; }
    std::vector<float> out(n);
    for (long k = 0; k < n; k += 8) e->fn(raw.data(), (int)k, out.data() + k);
    fwrite(out.data(), sizeof(float), n, stdout);
    return 0;
}
