// deltanet_host.cpp: run the Gated DeltaNet kernels of deltanet.cu on the CPU, for tests.
// Not a kernel and not fast: a host program built by tests (g++ -std=c++20 -pthread) that runs
// every block of a launch as 256 std::threads meeting at a std::barrier for __syncthreads, so the
// chunk prep and the scan's tile pipeline can be checked against numpy on a machine without a
// GPU. Shared memory is a function-local static, one block at a time.
//   deltanet_host QKV G BETA STATE O T C nk nv dk dv tiled
// QKV, G, BETA, STATE and O are raw float32 files; STATE and O are written back. The workspace
// (gcum, aqk, u, wk, sized as native/cuda/plan.py sizes them) starts as NaN, so a read of
// anything the prep did not write shows in the output.
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

// ---------------------------------------------------------------------------- the CUDA names deltanet.cu uses
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct dim3u { unsigned int x, y, z; };
static thread_local dim3u threadIdx;
static dim3u blockIdx, gridDim, blockDim = {256, 1, 1};
static std::barrier<>* block_barrier;
static void __syncthreads() { block_barrier->arrive_and_wait(); }
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
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

static void launch(unsigned int gx, unsigned int gy, const std::function<void()>& kernel) {
    std::barrier<> barrier(256);
    block_barrier = &barrier;
    gridDim = {gx, gy, 1};
    for (unsigned int y = 0; y < gy; ++y)
        for (unsigned int x = 0; x < gx; ++x) {
            blockIdx = {x, y, 0};
            std::vector<std::thread> threads;
            for (unsigned int t = 0; t < 256; ++t)
                threads.emplace_back([&, t] { threadIdx = {t, 0, 0}; kernel(); });
            for (std::thread& t : threads) t.join();
        }
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
    launch(nch, nv, [&] {
        gdn_chunk_prep(qkv.data(), g.data(), beta.data(), T, C, nk, nv, dk, dv, tiled,
                       gcum.data(), aqk.data(), u.data(), wk.data());
    });
    launch(nv, dv / GDN_SLICE, [&] {
        gdn_chunk_scan(qkv.data(), T, C, nk, nv, dk, dv, tiled, gcum.data(), aqk.data(), u.data(),
                       wk.data(), state.data(), o.data(), nch);
    });
    save(argv[4], state);
    save(argv[5], o);
    return 0;
}
