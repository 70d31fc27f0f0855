// moe.cu: the MoE block around the expert GEMMs: routing (softmax over all experts, top-k,
// renormalise), SiLU(gate) * up, and the weighted combine with the sigmoid-gated shared expert.
// Tokens are grouped by expert on the device (moe_tiles, moe_scatter) between routing and the
// GEMMs; the host reads only the counts back, to size the launches and pick the streamed experts.
#include "fermi.cuh"

#define ROUTE_THREADS 256
#define ROUTE_MAX_E 1024

// one block per token. logits: [T, E] -> ids, w: [T, k] (highest first, ties to the lower id)
extern "C" __global__ void moe_route(const float* logits, int* ids, float* w, int E, int k)
{
    __shared__ float p[ROUTE_MAX_E];
    __shared__ float rv[ROUTE_THREADS];
    __shared__ int ri[ROUTE_THREADS];
    __shared__ float picked[32];
    const int t = blockIdx.x, tid = threadIdx.x;
    const float* lg = logits + (long long)t * E;

    float m = -1e30f;
    for (int e = tid; e < E; e += ROUTE_THREADS) { p[e] = lg[e]; m = fmaxf(m, p[e]); }
    rv[tid] = m;
    __syncthreads();
    for (int s = ROUTE_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) rv[tid] = fmaxf(rv[tid], rv[tid + s]);
        __syncthreads();
    }
    m = rv[0];
    __syncthreads();
    float sum = 0.0f;
    for (int e = tid; e < E; e += ROUTE_THREADS) { p[e] = expf(p[e] - m); sum += p[e]; }
    rv[tid] = sum;
    __syncthreads();
    for (int s = ROUTE_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) rv[tid] += rv[tid + s];
        __syncthreads();
    }
    const float inv = 1.0f / rv[0];
    __syncthreads();
    for (int e = tid; e < E; e += ROUTE_THREADS) p[e] *= inv;
    __syncthreads();

    for (int j = 0; j < k; ++j) {
        float best = -1.0f;
        int bi = E;
        for (int e = tid; e < E; e += ROUTE_THREADS)
            if (p[e] > best) { best = p[e]; bi = e; }
        rv[tid] = best;
        ri[tid] = bi;
        __syncthreads();
        for (int s = ROUTE_THREADS / 2; s > 0; s >>= 1) {
            if (tid < s && (rv[tid + s] > rv[tid] || (rv[tid + s] == rv[tid] && ri[tid + s] < ri[tid]))) {
                rv[tid] = rv[tid + s];
                ri[tid] = ri[tid + s];
            }
            __syncthreads();
        }
        if (tid == 0) {
            ids[t * k + j] = ri[0];
            picked[j] = rv[0];
            p[ri[0]] = -2.0f;
        }
        __syncthreads();
    }
    if (tid == 0) {
        float total = 0.0f;
        for (int j = 0; j < k; ++j) total += picked[j];
        for (int j = 0; j < k; ++j) w[t * k + j] = picked[j] / total;
    }
}

// counts[e] += 1 for every (token, slot) routed to expert e; counts zeroed beforehand
extern "C" __global__ void moe_count(const int* ids, int* counts, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(counts + ids[i], 1);
}

// one block. counts [E] -> cursor [E] (each expert's first row, experts in order) and tiles
// [n, 4] = (expert, first row, rows, 0): ceil(count / bm) tiles per expert, in expert order.
// The host computes the same tile starts from the counts it reads back (layers.py `group`).
extern "C" __global__ void moe_tiles(const int* counts, int* cursor, int* tiles, int E, int bm)
{
    __shared__ int rsum[ROUTE_THREADS], tsum[ROUTE_THREADS];
    const int tid = threadIdx.x, per = (E + ROUTE_THREADS - 1) / ROUTE_THREADS;
    const int e0 = min(tid * per, E), e1 = min(e0 + per, E);
    int rows = 0, ntile = 0;
    for (int e = e0; e < e1; ++e) { rows += counts[e]; ntile += (counts[e] + bm - 1) / bm; }
    rsum[tid] = rows;
    tsum[tid] = ntile;
    __syncthreads();
    for (int s = 1; s < ROUTE_THREADS; s <<= 1) {       // inclusive scan of the threads' sums
        const int a = tid >= s ? rsum[tid - s] : 0, b = tid >= s ? tsum[tid - s] : 0;
        __syncthreads();
        rsum[tid] += a;
        tsum[tid] += b;
        __syncthreads();
    }
    int row = rsum[tid] - rows, tile = tsum[tid] - ntile;
    for (int e = e0; e < e1; ++e) {
        const int c = counts[e];
        cursor[e] = row;
        for (int r0 = 0; r0 < c; r0 += bm, ++tile) {
            int* t = tiles + 4 * tile;
            t[0] = e;
            t[1] = row + r0;
            t[2] = min(bm, c - r0);
            t[3] = 0;
        }
        row += c;
    }
}

// group (token, slot) pairs by expert: cursor starts at each expert's first row. Rows within
// an expert come in any order; every row is computed on its own, so results do not depend on it.
// tok[row] = token of that row, pos[t * k + j] = row of pair (t, j)
extern "C" __global__ void moe_scatter(const int* ids, int* cursor, int* tok, int* pos, int n, int k)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int row = atomicAdd(cursor + ids[i], 1);
    tok[row] = i / k;
    pos[i] = row;
}

// act[r, f] = silu(gate[r, f]) * up[r, f] over n elements
extern "C" __global__ void silu_mul(const float* gate, const float* up, float* act, long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) act[i] = fm_silu(gate[i]) * up[i];
}

// x[t, d] += sum_j w[t, j] * down[pos[t, j], d] + sigmoid(sg[t]) * shared[t, d]
// down rows are in expert order; pos maps (token, slot) to its row. shared may be null.
extern "C" __global__ void moe_combine(float* x, const float* down, const int* pos, const float* w,
                                       const float* shared, const float* sg, int T, int H, int k)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)T * H) return;
    const int t = (int)(i / H), d = (int)(i % H);
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += w[t * k + j] * down[(long long)pos[t * k + j] * H + d];
    if (shared) acc += (sg ? fm_sigmoid(sg[t]) : 1.0f) * shared[i];
    x[i] += acc;
}
