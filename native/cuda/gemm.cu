// gemm.cu: Y[rows, N] (+)= X[rows, K] . W[N, K]^T with W kept in its GGUF blocks.
// Per weight type a GEMM kernel and a fused gate/up one (GATE_UP below), all sharing one body. Work comes
// as tiles of at most BM rows: {group, row0, nrows, unused}. A group selects a weight matrix (an
// expert) through `woff`; dense layers use one group. X rows may be gathered through `xrows`
// (tokens routed to an expert); Y rows are written at row0.. in tile order.
// Not here: tensor cores, half arithmetic, shuffles. fp32 accumulation in registers.
//
// Each block computes BM x BN outputs with 256 threads, 8 rows x 4 columns per thread (32
// accumulators, which leaves room under Fermi's 63 registers). K advances 8 at a time through
// two shared-memory stages: the raw words of the next tile (8 quantized weights of one W row,
// or a float4 of X) are loaded into registers before the current tile is computed, then
// decoded into the other stage, so each weight is dequantized once per block and one barrier
// separates the tiles. Fragments are read as float4: 3 shared loads per 32 FMAs. The k loop of a
// tile stays rolled: unrolled, the compiler hoists fragment loads past the register cap. A warp
// computes 16 rows, and skips its FMAs when all of them lie past the tile's rows (experts' last
// tiles are partly empty).
// GATE_UP (the MoE's gate and up in one launch): a block's BN columns are BN/2 features, each
// as its gate row of W + woff[group] then its up row of W + woff_up[group], so a thread's 4
// columns hold (gate, up) of 2 features and the epilogue writes Y[r, f] = silu(gate) * up.
// Register use (ptxas -v, sm_75, -maxrregcount=63) is in docs/performance.md.
#include "quant.cuh"

#define GEMM_THREADS 256
#define GEMM_TM 8                                        // rows per thread
#define GEMM_TN 4                                        // columns per thread
#define GEMM_XPAD 4                                      // X tile row padding: conflict-free stores, float4 reads

// acc[8][4] += the thread's rows of one X tile times its columns of one W tile (both k-major):
// x points at its first row's X values, w at its first column's W values, both at k = 0
template <int BM, int BN, int BK>
__device__ __forceinline__ void gemm_tile(float (&acc)[GEMM_TM][GEMM_TN], const float* x, const float* w)
{
#pragma unroll 1
    for (int kk = 0; kk < BK; ++kk, x += BM + GEMM_XPAD, w += BN) {
        const float4 b = *(const float4*)w;
        const float bb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int h = 0; h < 2; ++h) {                    // rows 0-3, then 4-7: 8 fragment registers
            const float4 a = *(const float4*)(x + 4 * h);
            const float aa[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < GEMM_TN; ++j) acc[4 * h + i][j] += aa[i] * bb[j];
        }
    }
}

// The K loop of one thread. LOADS_W: it loads the 8 weights of W row threadIdx.x per tile (wsrc
// null past N); otherwise a float4 of X row xm from k xk (xsrc null past the tile's rows). The
// raw words of tile k0 + BK are in flight while tile k0 is computed; they are decoded into the
// other stage, with the scale of a span (Q4_K: 32 weights) read and decoded once, at the span's
// first tile. Threads of a warp share one role, so both role paths meet the same barriers.
template <class QT, int BM, int BN, int BK, bool LOADS_W>
__device__ __forceinline__ void gemm_loop(float (&acc)[GEMM_TM][GEMM_TN], float (*xs)[BK][BM + GEMM_XPAD],
                                          float (*ws)[BK][BN], const unsigned char* wsrc, const float* xsrc,
                                          int xm, int xk, int tm, int tn, bool busy, int K)
{
    typename QT::scale sc;
    typename QT::raw wr;
    float4 xv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (LOADS_W && wsrc) QT::load(wsrc, 0, wr);
    if (!LOADS_W && xsrc) xv = *(const float4*)xsrc;
    int s = 0;
    for (int k0 = 0;; k0 += BK) {
        if (LOADS_W) {
            if (wsrc) {
                if (k0 % QT::SPAN == 0) QT::load_scale(wsrc, k0, sc);      // every warp at once
                QT::decode(wr, sc, k0, &ws[s][0][threadIdx.x], BN);
            } else {
#pragma unroll
                for (int i = 0; i < BK; ++i) ws[s][i][threadIdx.x] = 0.0f;
            }
        } else {
            xs[s][xk + 0][xm] = xv.x;
            xs[s][xk + 1][xm] = xv.y;
            xs[s][xk + 2][xm] = xv.z;
            xs[s][xk + 3][xm] = xv.w;
        }
        __syncthreads();
        const int k1 = k0 + BK;
        if (k1 < K) {
            if (LOADS_W && wsrc) QT::load(wsrc, k1, wr);
            if (!LOADS_W && xsrc) xv = *(const float4*)(xsrc + k1);
        }
        if (busy) gemm_tile<BM, BN, BK>(acc, &xs[s][0][tm], &ws[s][0][tn]);
        if (k1 >= K) break;
        s ^= 1;                 // stage s^1 was last read before the barrier above
    }
}

template <class QT, int BM, int BN, int BK, bool GATE_UP>
__device__ __forceinline__ void gemm_body(
    const float* X, int ldx, const int* xrows,           // X: [*, K] row stride ldx; xrows: [rows] or null
    float* Y, int ldy, int accumulate,                   // Y: [*, N] row stride ldy
    const unsigned char* W, const long long* woff,       // W: [N, row_bytes] per group at W + woff[group]
    const long long* woff_up,                            // GATE_UP: the up rows' table, like woff
    long long row_bytes, const int* tiles, int N, int K)
{
    static_assert((BM / GEMM_TM) * (BN / GEMM_TN) == GEMM_THREADS, "an 8 x 4 block of outputs per thread");
    static_assert(BN + BM * BK / 4 == GEMM_THREADS && BN % 32 == 0, "W rows, then X float4s: whole warps");
    static_assert(BM % 16 == 0 && BN % 64 == 0 && BK == 8, "warps tile 16 x 64; a W load is one tile row");
    __shared__ __align__(16) float xs[2][BK][BM + GEMM_XPAD];   // X tiles, k-major
    __shared__ __align__(16) float ws[2][BK][BN];        // dequantized W tiles, k-major

    const int tid = threadIdx.x;
    const int n0 = blockIdx.x * BN;
    const int* tile = tiles + 4 * blockIdx.y;
    const int group = tile[0], row0 = tile[1], nrows = tile[2];

    // W loaders: the first BN threads, row tid of the tile (a warp: 32 rows); GATE_UP: the gate
    // (even tid) or up (odd tid) row of feature tid / 2
    const bool loads_w = tid < BN;
    const int wn = GATE_UP ? blockIdx.x * (BN / 2) + tid / 2 : n0 + tid;
    const long long* wtab = GATE_UP && (tid & 1) ? woff_up : woff;
    const unsigned char* wsrc = 0;
    if (loads_w && wn < N) wsrc = W + (wtab ? wtab[group] : 0) + (long long)wn * row_bytes;
    // X loaders: the other threads, row xm of the tile, 4 consecutive k from xk
    const int ux = loads_w ? 0 : tid - BN;
    const int xm = ux / (BK / 4), xk = (ux % (BK / 4)) * 4;
    const float* xsrc = 0;
    if (!loads_w && xm < nrows) {
        const int r = row0 + xm;
        xsrc = X + (long long)(xrows ? xrows[r] : r) * ldx + xk;
    }

    // compute role: a warp covers 16 x 64 outputs as 2 x 16 threads, so its float4 fragment loads
    // touch 2 distinct X and 16 distinct W addresses (broadcasts, no bank conflicts)
    const int warp = tid / 32, lane = tid % 32;
    const int tm = (warp / (BN / 64)) * 16 + (lane / 16) * GEMM_TM;
    const int tn = (warp % (BN / 64)) * 64 + (lane % 16) * GEMM_TN;
    const bool busy = (warp / (BN / 64)) * 16 < nrows;   // the warp has rows in this tile
    float acc[GEMM_TM][GEMM_TN];
#pragma unroll
    for (int i = 0; i < GEMM_TM; ++i)
#pragma unroll
        for (int j = 0; j < GEMM_TN; ++j) acc[i][j] = 0.0f;

    if (loads_w)
        gemm_loop<QT, BM, BN, BK, true>(acc, xs, ws, wsrc, xsrc, xm, xk, tm, tn, busy, K);
    else
        gemm_loop<QT, BM, BN, BK, false>(acc, xs, ws, wsrc, xsrc, xm, xk, tm, tn, busy, K);

    // the epilogue re-reads what the K loop does not need, rather than holding it in registers
    const volatile int* vtile = tiles + 4 * blockIdx.y;
    const int y0 = vtile[1], yn = vtile[2];
    const int ym = (warp / (BN / 64)) * 16 + (lane / 16) * GEMM_TM;
    const int yc = (warp % (BN / 64)) * 64 + (lane % 16) * GEMM_TN;     // the thread's first tile column
#pragma unroll
    for (int i = 0; i < GEMM_TM; ++i) {
        if (ym + i < yn) {
            float* y = Y + (long long)(y0 + ym + i) * ldy;
#pragma unroll
            for (int j = 0; j < (GATE_UP ? GEMM_TN / 2 : GEMM_TN); ++j) {
                const int n = GATE_UP ? blockIdx.x * (BN / 2) + yc / 2 + j : blockIdx.x * BN + yc + j;
                const float v = GATE_UP ? fm_silu(acc[i][2 * j]) * acc[i][2 * j + 1] : acc[i][j];
                if (n < N) y[n] = accumulate ? y[n] + v : v;
            }
        }
    }
}

// 64 x 128 outputs per block, 8 k per stage: W rows are loaded by warps 0-3, X by warps 4-7.
// (A 32 x 256 shape for experts that see few tokens each was slower at every measured shape
// once warps skip the empty rows of a tile: docs/performance.md.)
#define GEMM_KERNEL(name, qt)                                                                   \
    extern "C" __global__ void name(                                                            \
        const float* X, int ldx, const int* xrows, float* Y, int ldy, int accumulate,           \
        const unsigned char* W, const long long* woff, long long row_bytes, const int* tiles,   \
        int N, int K)                                                                           \
    {                                                                                           \
        gemm_body<qt, 64, 128, 8, false>(X, ldx, xrows, Y, ldy, accumulate, W, woff, 0, row_bytes, tiles, N, K); \
    }

// act[rows, N] = silu(X . Wg^T) * (X . Wu^T): 64 features per block, N the features
#define GATE_UP_KERNEL(name, qt)                                                                \
    extern "C" __global__ void name(                                                            \
        const float* X, int ldx, const int* xrows, float* Y, int ldy, const unsigned char* W,   \
        const long long* woff, const long long* woff_up, long long row_bytes, const int* tiles, \
        int N, int K)                                                                           \
    {                                                                                           \
        gemm_body<qt, 64, 128, 8, true>(X, ldx, xrows, Y, ldy, 0, W, woff, woff_up, row_bytes, tiles, N, K); \
    }

#define GEMM_KERNELS(t, qt) GEMM_KERNEL(gemm_##t, qt) GATE_UP_KERNEL(gemm_gate_up_##t, qt)
GEMM_KERNELS(f32, QT_f32)
GEMM_KERNELS(f16, QT_f16)
GEMM_KERNELS(bf16, QT_bf16)
GEMM_KERNELS(q8_0, QT_q8_0)
GEMM_KERNELS(q4_0, QT_q4_0)
GEMM_KERNELS(q4_k, QT_q4_k)
GEMM_KERNELS(q5_k, QT_q5_k)
GEMM_KERNELS(q6_k, QT_q6_k)
GEMM_KERNELS(q4_1, QT_q4_1)
GEMM_KERNELS(q5_0, QT_q5_0)
GEMM_KERNELS(q5_1, QT_q5_1)
GEMM_KERNELS(q2_k, QT_q2_k)
GEMM_KERNELS(q3_k, QT_q3_k)
GEMM_KERNELS(tq1_0, QT_tq1_0)
GEMM_KERNELS(tq2_0, QT_tq2_0)
GEMM_KERNELS(iq4_nl, QT_iq4_nl)
GEMM_KERNELS(iq4_xs, QT_iq4_xs)
GEMM_KERNELS(mxfp4, QT_mxfp4)
GEMM_KERNELS(iq2_xxs, QT_iq2_xxs)
GEMM_KERNELS(iq2_xs, QT_iq2_xs)
GEMM_KERNELS(iq2_s, QT_iq2_s)
GEMM_KERNELS(iq3_xxs, QT_iq3_xxs)
GEMM_KERNELS(iq3_s, QT_iq3_s)
GEMM_KERNELS(iq1_s, QT_iq1_s)
GEMM_KERNELS(iq1_m, QT_iq1_m)

// ---------------------------------------------------------------------------- row dequantization
// out[r, :] = W[rows ? rows[r] : r, :] as fp32, one block per row (embedding lookups)
#define DEQUANT_ROWS_KERNEL(name, dq)                                                           \
    extern "C" __global__ void name(const unsigned char* W, long long row_bytes, const int* rows, \
                                    float* out, int K)                                          \
    {                                                                                           \
        const int r = blockIdx.x;                                                               \
        const unsigned char* src = W + (long long)(rows ? rows[r] : r) * row_bytes;             \
        float v[8];                                                                             \
        for (int k = threadIdx.x * 8; k < K; k += blockDim.x * 8) {                             \
            dq(src, k, v);                                                                      \
            for (int i = 0; i < 8; ++i) out[(long long)r * K + k + i] = v[i];                  \
        }                                                                                       \
    }

DEQUANT_ROWS_KERNEL(rows_f32, dq8_f32)
DEQUANT_ROWS_KERNEL(rows_f16, dq8_f16)
DEQUANT_ROWS_KERNEL(rows_bf16, dq8_bf16)
DEQUANT_ROWS_KERNEL(rows_q8_0, dq8_q8_0)
DEQUANT_ROWS_KERNEL(rows_q4_0, dq8_q4_0)
DEQUANT_ROWS_KERNEL(rows_q4_k, dq8_q4_k)
DEQUANT_ROWS_KERNEL(rows_q5_k, dq8_q5_k)
DEQUANT_ROWS_KERNEL(rows_q6_k, dq8_q6_k)
DEQUANT_ROWS_KERNEL(rows_q4_1, dq8_q4_1)
DEQUANT_ROWS_KERNEL(rows_q5_0, dq8_q5_0)
DEQUANT_ROWS_KERNEL(rows_q5_1, dq8_q5_1)
DEQUANT_ROWS_KERNEL(rows_q2_k, dq8_q2_k)
DEQUANT_ROWS_KERNEL(rows_q3_k, dq8_q3_k)
DEQUANT_ROWS_KERNEL(rows_tq1_0, dq8_tq1_0)
DEQUANT_ROWS_KERNEL(rows_tq2_0, dq8_tq2_0)
DEQUANT_ROWS_KERNEL(rows_iq4_nl, dq8_iq4_nl)
DEQUANT_ROWS_KERNEL(rows_iq4_xs, dq8_iq4_xs)
DEQUANT_ROWS_KERNEL(rows_mxfp4, dq8_mxfp4)
DEQUANT_ROWS_KERNEL(rows_iq2_xxs, dq8_iq2_xxs)
DEQUANT_ROWS_KERNEL(rows_iq2_xs, dq8_iq2_xs)
DEQUANT_ROWS_KERNEL(rows_iq2_s, dq8_iq2_s)
DEQUANT_ROWS_KERNEL(rows_iq3_xxs, dq8_iq3_xxs)
DEQUANT_ROWS_KERNEL(rows_iq3_s, dq8_iq3_s)
DEQUANT_ROWS_KERNEL(rows_iq1_s, dq8_iq1_s)
DEQUANT_ROWS_KERNEL(rows_iq1_m, dq8_iq1_m)
