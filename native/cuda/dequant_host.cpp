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
    {"Q4_1", dq8_q4_1, 32, 20}, {"Q5_0", dq8_q5_0, 32, 22}, {"Q5_1", dq8_q5_1, 32, 24},
    {"Q2_K", dq8_q2_k, 256, 84}, {"Q3_K", dq8_q3_k, 256, 110}, {"TQ1_0", dq8_tq1_0, 256, 54},
    {"TQ2_0", dq8_tq2_0, 256, 66}, {"IQ4_NL", dq8_iq4_nl, 32, 18}, {"IQ4_XS", dq8_iq4_xs, 256, 136},
    {"MXFP4", dq8_mxfp4, 32, 17}, {"IQ2_XXS", dq8_iq2_xxs, 256, 66}, {"IQ2_XS", dq8_iq2_xs, 256, 74},
    {"IQ2_S", dq8_iq2_s, 256, 82}, {"IQ3_XXS", dq8_iq3_xxs, 256, 98}, {"IQ3_S", dq8_iq3_s, 256, 110},
    {"IQ1_S", dq8_iq1_s, 256, 50}, {"IQ1_M", dq8_iq1_m, 256, 56},
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
