// host_launch.h: the CUDA names the prefill kernels use, for building a .cu for the CPU in tests,
// and launch(), which runs every block of a grid as std::threads meeting at a std::barrier for
// __syncthreads. Not fast; it checks indexing, loader roles and stages against numpy without a GPU.
// Shared memory is the kernels' function-local statics, one block at a time.
#pragma once
#include <algorithm>
#include <barrier>
#include <functional>
#include <thread>
#include <vector>

struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct uint2 { unsigned int x, y; };
struct uint4 { unsigned int x, y, z, w; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline uint2 make_uint2(unsigned int a, unsigned int b) { return {a, b}; }
struct dim3u { unsigned int x, y, z; };
static thread_local dim3u threadIdx;
static dim3u blockIdx, gridDim, blockDim = {256, 1, 1};
static std::barrier<>* block_barrier;
static void __syncthreads() { block_barrier->arrive_and_wait(); }
using std::max;
using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

// every block of a gx x gy grid, one after another, each as `threads` threads running kernel()
static void launch(unsigned int gx, unsigned int gy, unsigned int threads, const std::function<void()>& kernel) {
    std::barrier<> barrier(threads);
    block_barrier = &barrier;
    gridDim = {gx, gy, 1};
    blockDim = {threads, 1, 1};
    for (unsigned int y = 0; y < gy; ++y)
        for (unsigned int x = 0; x < gx; ++x) {
            blockIdx = {x, y, 0};
            std::vector<std::thread> pool;
            for (unsigned int t = 0; t < threads; ++t)
                pool.emplace_back([&, t] { threadIdx = {t, 0, 0}; kernel(); });
            for (std::thread& t : pool) t.join();
        }
}
