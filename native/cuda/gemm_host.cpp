// gemm_host.cpp: run the GEMM kernels of gemm.cu on the CPU, for tests.
// Not a kernel and not fast: a host program built by tests (g++ -std=c++20 -pthread) that runs
// every block of a launch as 256 std::threads meeting at a std::barrier for __syncthreads, so
// the kernels' indexing, loader roles and two-stage pipeline can be checked against numpy on a
// machine without a GPU. Shared memory is a function-local static, one block at a time.
//   gemm_host KERNEL X W TILES XROWS|- WOFF|- Y ldx ldy row_bytes N K n_tiles accumulate
// X, W, TILES, XROWS (int32), WOFF (int64 byte offsets into W) and Y are raw files; Y is
// read, updated in place and written back. For gemm_gate_up_* kernels WOFF holds the gate
// table, then the up table (as many entries each), and accumulate is ignored.
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

// ---------------------------------------------------------------------------- the CUDA names gemm.cu uses
struct uint2 { unsigned int x, y; };
struct uint4 { unsigned int x, y, z, w; };
struct float4 { float x, y, z, w; };
static inline uint2 make_uint2(unsigned int a, unsigned int b) { return {a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct dim3u { unsigned int x, y, z; };
static thread_local dim3u threadIdx;
static dim3u blockIdx, blockDim = {256, 1, 1};
static std::barrier<>* block_barrier;
static void __syncthreads() { block_barrier->arrive_and_wait(); }
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#include "gemm.cu"

// ---------------------------------------------------------------------------- driver
typedef void (*Kernel)(const float*, int, const int*, float*, int, int, const unsigned char*, const long long*,
                       long long, const int*, int, int);
typedef void (*GateUp)(const float*, int, const int*, float*, int, const unsigned char*, const long long*,
                       const long long*, long long, const int*, int, int);
struct Entry { const char* name; Kernel fn; GateUp gate_up; };
#define GEMM_ENTRY(t) {"gemm_" #t, gemm_##t, 0}, {"gemm_gate_up_" #t, 0, gemm_gate_up_##t}
static const Entry TABLE[] = {GEMM_ENTRY(f32), GEMM_ENTRY(f16), GEMM_ENTRY(bf16), GEMM_ENTRY(q8_0),
                              GEMM_ENTRY(q4_0), GEMM_ENTRY(q4_k), GEMM_ENTRY(q5_k), GEMM_ENTRY(q6_k)};
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
    std::barrier<> barrier(256);
    block_barrier = &barrier;
    const float* x = (const float*)X.data();
    const int* xr = xrows.empty() ? 0 : (const int*)xrows.data();
    const unsigned char* w = woff.empty() ? W.data() : 0;
    const long long* wo = woff.empty() ? 0 : woff.data();
    const int columns = e->gate_up ? BLOCK_COLUMNS / 2 : BLOCK_COLUMNS;
    for (int by = 0; by < n_tiles; ++by) {
        for (int bx = 0; bx < (N + columns - 1) / columns; ++bx) {
            blockIdx = {(unsigned int)bx, (unsigned int)by, 0};
            std::vector<std::thread> threads;
            for (int t = 0; t < 256; ++t)
                threads.emplace_back([&, t] {
                    threadIdx = {(unsigned int)t, 0, 0};
                    float* y = (float*)Y.data();
                    if (e->gate_up)
                        e->gate_up(x, ldx, xr, y, ldy, w, wo, wo ? wo + woff.size() / 2 : 0, row_bytes,
                                   (const int*)tiles.data(), N, K);
                    else
                        e->fn(x, ldx, xr, y, ldy, accumulate, w, wo, row_bytes, (const int*)tiles.data(), N, K);
                });
            for (std::thread& t : threads) t.join();
        }
    }
    FILE* f = fopen(argv[7], "wb");
    fwrite(Y.data(), 1, Y.size() - 16, f);
    fclose(f);
    return 0;
}
