// gemm_host.cpp: run the GEMM kernels of gemm.cu on the CPU, for tests.
// A host program built by tests (g++ -std=c++20 -pthread) that runs every block of a launch as
// 256 threads (host_launch.h), so the kernels' indexing, loader roles and two-stage pipeline can
// be checked against numpy on a machine without a GPU.
//   gemm_host KERNEL X W TILES XROWS|- WOFF|- Y ldx ldy row_bytes N K n_tiles accumulate
// X, W, TILES, XROWS (int32), WOFF (int64 byte offsets into W) and Y are raw files; Y is
// read, updated in place and written back. For gemm_gate_up_* kernels WOFF holds the gate
// table, then the up table (as many entries each), and accumulate is ignored.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "host_launch.h"
#include "gemm.cu"

// ---------------------------------------------------------------------------- driver
typedef void (*Kernel)(const float*, int, const int*, float*, int, int, const unsigned char*, const long long*,
                       long long, const int*, int, int);
typedef void (*GateUp)(const float*, int, const int*, float*, int, const unsigned char*, const long long*,
                       const long long*, long long, const int*, int, int);
struct Entry { const char* name; Kernel fn; GateUp gate_up; };
#define GEMM_ENTRY(t) {"gemm_" #t, gemm_##t, 0}, {"gemm_gate_up_" #t, 0, gemm_gate_up_##t}
static const Entry TABLE[] = {GEMM_ENTRY(f32), GEMM_ENTRY(f16), GEMM_ENTRY(bf16), GEMM_ENTRY(q8_0),
                              GEMM_ENTRY(q4_0), GEMM_ENTRY(q4_k), GEMM_ENTRY(q5_k), GEMM_ENTRY(q6_k),
                              GEMM_ENTRY(q4_1), GEMM_ENTRY(q5_0), GEMM_ENTRY(q5_1), GEMM_ENTRY(q2_k), GEMM_ENTRY(q3_k),
                              GEMM_ENTRY(tq1_0), GEMM_ENTRY(tq2_0), GEMM_ENTRY(iq4_nl), GEMM_ENTRY(iq4_xs), GEMM_ENTRY(mxfp4),
                              GEMM_ENTRY(iq2_xxs), GEMM_ENTRY(iq2_xs), GEMM_ENTRY(iq2_s), GEMM_ENTRY(iq3_xxs), GEMM_ENTRY(iq3_s),
                              GEMM_ENTRY(iq1_s), GEMM_ENTRY(iq1_m)};
static const int BLOCK_COLUMNS = 128;               // GEMM_BN of native/cuda/kernels.py; gate/up: half as many features

static std::vector<unsigned char> load(const char* path) {
    std::vector<unsigned char> v;
    if (!strcmp(path, "-")) return v;
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); exit(2); }
    fseek(f, 0, SEEK_END);
    v.resize(ftell(f) + 16);                        // vector loads may not read past the end, but stay safe
    fseek(f, 0, SEEK_SET);
    if (fread(v.data(), 1, v.size() - 16, f) != v.size() - 16) { fprintf(stderr, "short %s\n", path); exit(2); }
    fclose(f);
    return v;
}

int main(int argc, char** argv) {
    if (argc != 15) { fprintf(stderr, "usage: see the header of gemm_host.cpp\n"); return 2; }
    const Entry* e = 0;
    for (const Entry& t : TABLE) if (!strcmp(t.name, argv[1])) e = &t;
    if (!e) { fprintf(stderr, "unknown kernel %s\n", argv[1]); return 2; }
    std::vector<unsigned char> X = load(argv[2]), W = load(argv[3]), tiles = load(argv[4]);
    std::vector<unsigned char> xrows = load(argv[5]), woff_raw = load(argv[6]), Y = load(argv[7]);
    const int ldx = atoi(argv[8]), ldy = atoi(argv[9]), N = atoi(argv[11]), K = atoi(argv[12]);
    const int n_tiles = atoi(argv[13]), accumulate = atoi(argv[14]);
    const long long row_bytes = atoll(argv[10]);
    std::vector<long long> woff((woff_raw.size() - (woff_raw.empty() ? 0 : 16)) / 8);
    for (size_t g = 0; g < woff.size(); ++g) {
        long long off;
        memcpy(&off, woff_raw.data() + 8 * g, 8);
        woff[g] = (long long)(size_t)W.data() + off;
    }
    const float* x = (const float*)X.data();
    const int* xr = xrows.empty() ? 0 : (const int*)xrows.data();
    const unsigned char* w = woff.empty() ? W.data() : 0;
    const long long* wo = woff.empty() ? 0 : woff.data();
    const int columns = e->gate_up ? BLOCK_COLUMNS / 2 : BLOCK_COLUMNS;
    float* y = (float*)Y.data();
    launch((N + columns - 1) / columns, n_tiles, 256, [&] {
        if (e->gate_up)
            e->gate_up(x, ldx, xr, y, ldy, w, wo, wo ? wo + woff.size() / 2 : 0, row_bytes, (const int*)tiles.data(), N, K);
        else
            e->fn(x, ldx, xr, y, ldy, accumulate, w, wo, row_bytes, (const int*)tiles.data(), N, K);
    });
    FILE* f = fopen(argv[7], "wb");
    fwrite(Y.data(), 1, Y.size() - 16, f);
    fclose(f);
    return 0;
}
