// deltanet_host.cpp: run the Gated DeltaNet kernels of deltanet.cu on the CPU, for tests.
// A host program built by tests (g++ -std=c++20 -pthread) that runs every block of a launch as
// 256 threads (host_launch.h), so the chunk prep and the scan's tile pipeline can be checked
// against numpy on a machine without a GPU.
//   deltanet_host QKV G BETA STATE O T C nk nv dk dv tiled
// QKV, G, BETA, STATE and O are raw float32 files; STATE and O are written back. The workspace
// (gcum, aqk, u, wk, sized as native/cuda/plan.py sizes them) starts as NaN, so a read of
// anything the prep did not write shows in the output.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "host_launch.h"
#include "deltanet.cu"

// ---------------------------------------------------------------------------- driver
static std::vector<float> load(const char* path, size_t n) {
    std::vector<float> v(n);
    FILE* f = fopen(path, "rb");
    if (!f || fread(v.data(), 4, n, f) != n) { fprintf(stderr, "cannot read %zu floats from %s\n", n, path); exit(2); }
    fclose(f);
    return v;
}

static void save(const char* path, const std::vector<float>& v) {
    FILE* f = fopen(path, "wb");
    fwrite(v.data(), 4, v.size(), f);
    fclose(f);
}

int main(int argc, char** argv) {
    if (argc != 13) { fprintf(stderr, "usage: see the header of deltanet_host.cpp\n"); return 2; }
    const int T = atoi(argv[6]), C = atoi(argv[7]), nk = atoi(argv[8]), nv = atoi(argv[9]);
    const int dk = atoi(argv[10]), dv = atoi(argv[11]), tiled = atoi(argv[12]);
    const int nch = (T + GDN_C - 1) / GDN_C, rows = nch * GDN_C;
    std::vector<float> qkv = load(argv[1], (size_t)T * C), g = load(argv[2], (size_t)T * nv);
    std::vector<float> beta = load(argv[3], (size_t)T * nv), state = load(argv[4], (size_t)nv * dk * dv);
    std::vector<float> o = load(argv[5], (size_t)T * nv * dv);
    std::vector<float> gcum(rows * nv, NAN), aqk((size_t)rows * 64 * nv, NAN);
    std::vector<float> u((size_t)rows * nv * dv, NAN), wk((size_t)rows * nv * dk, NAN);
    launch(nch, nv, 256, [&] {
        gdn_chunk_prep(qkv.data(), g.data(), beta.data(), T, C, nk, nv, dk, dv, tiled,
                       gcum.data(), aqk.data(), u.data(), wk.data());
    });
    launch(nv, dv / GDN_SLICE, 256, [&] {
        gdn_chunk_scan(qkv.data(), T, C, nk, nv, dk, dv, tiled, gcum.data(), aqk.data(), u.data(),
                       wk.data(), state.data(), o.data(), nch);
    });
    save(argv[4], state);
    save(argv[5], o);
    return 0;
}
