// gemm.cu: Y[rows, N] (+)= X[rows, K] . W[N, K]^T with W kept in its GGUF blocks.
// One kernel per weight type and tile shape, all sharing one body and one signature. Work comes
// as tiles of at most BM rows: {group, row0, nrows, unused}. A group selects a weight matrix (an
// expert) through `woff`; dense layers use one group. X rows may be gathered through `xrows`
// (tokens routed to an expert); Y rows are written at row0.. in tile order.
// Not here: tensor cores, half arithmetic, shuffles. fp32 accumulation in registers.
#include "quant.cuh"

#define GEMM_BK 32
#define GEMM_PAD 4
#define GEMM_THREADS 256

// BM x BN outputs per block, a 4 x 4 block of them per thread: (BM / 4) * (BN / 4) == 256.
// 64 x 64 for dense layers; 32 x 128 for experts that see few tokens each (less padding).
template <void (*DQ)(const unsigned char*, int, float*), int BM, int BN>
__device__ __forceinline__ void gemm_body(
    const float* X, int ldx, const int* xrows,           // X: [*, K] row stride ldx; xrows: [rows] or null
    float* Y, int ldy, int accumulate,                   // Y: [*, N] row stride ldy
    const unsigned char* W, const long long* woff,       // W: [N, row_bytes] per group at W + woff[group]
    long long row_bytes, const int* tiles, int N, int K)
{
    __shared__ float xs[GEMM_BK][BM + GEMM_PAD];         // X tile, k-major
    __shared__ float ws[GEMM_BK][BN + GEMM_PAD];         // dequantized W tile, k-major
    const int WL = BN * 4 / GEMM_THREADS;                // W rows each thread loads (1 or 2)

    const int tid = threadIdx.x;
    const int n0 = blockIdx.x * BN;
    const int* tile = tiles + 4 * blockIdx.y;
    const int group = tile[0], row0 = tile[1], nrows = tile[2];
    const unsigned char* wbase = W + (woff ? woff[group] : 0);

    // loader role: rows of each tile, 8 consecutive k
    const int lr = tid >> 2, lk = (tid & 3) * 8;
    const float* xsrc = 0;
    if (lr < BM && lr < nrows) {
        int r = row0 + lr;
        xsrc = X + (long long)(xrows ? xrows[r] : r) * ldx;
    }
    const unsigned char* wsrc[WL];
#pragma unroll
    for (int j = 0; j < WL; ++j) {
        int n = n0 + lr + 64 * j;
        wsrc[j] = n < N ? wbase + (long long)n * row_bytes : 0;
    }

    // compute role: a 4 x 4 block of outputs
    const int tm = (tid / (BN / 4)) * 4, tn = (tid % (BN / 4)) * 4;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += GEMM_BK) {
        float v[8];
        if (lr < BM) {
            if (xsrc) {
                for (int i = 0; i < 8; ++i) v[i] = xsrc[k0 + lk + i];
            } else {
                for (int i = 0; i < 8; ++i) v[i] = 0.0f;
            }
            for (int i = 0; i < 8; ++i) xs[lk + i][lr] = v[i];
        }
#pragma unroll
        for (int j = 0; j < WL; ++j) {
            if (wsrc[j]) {
                DQ(wsrc[j], k0 + lk, v);
            } else {
                for (int i = 0; i < 8; ++i) v[i] = 0.0f;
            }
            for (int i = 0; i < 8; ++i) ws[lk + i][lr + 64 * j] = v[i];
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < GEMM_BK; ++kk) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) { a[i] = xs[kk][tm + i]; b[i] = ws[kk][tn + i]; }
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }

    for (int i = 0; i < 4; ++i) {
        if (tm + i >= nrows) break;
        float* y = Y + (long long)(row0 + tm + i) * ldy;
        for (int j = 0; j < 4; ++j) {
            int n = n0 + tn + j;
            if (n < N) y[n] = accumulate ? y[n] + acc[i][j] : acc[i][j];
        }
    }
}

#define GEMM_KERNEL(name, dq, bm, bn)                                                           \
    extern "C" __global__ void name(                                                            \
        const float* X, int ldx, const int* xrows, float* Y, int ldy, int accumulate,           \
        const unsigned char* W, const long long* woff, long long row_bytes, const int* tiles,   \
        int N, int K)                                                                           \
    {                                                                                           \
        gemm_body<dq, bm, bn>(X, ldx, xrows, Y, ldy, accumulate, W, woff, row_bytes, tiles, N, K); \
    }

GEMM_KERNEL(gemm_f32, dq8_f32, 64, 64)
GEMM_KERNEL(gemm_f16, dq8_f16, 64, 64)
GEMM_KERNEL(gemm_bf16, dq8_bf16, 64, 64)
GEMM_KERNEL(gemm_q8_0, dq8_q8_0, 64, 64)
GEMM_KERNEL(gemm_q4_0, dq8_q4_0, 64, 64)
GEMM_KERNEL(gemm_q4_k, dq8_q4_k, 64, 64)
GEMM_KERNEL(gemm_q5_k, dq8_q5_k, 64, 64)
GEMM_KERNEL(gemm_q6_k, dq8_q6_k, 64, 64)
GEMM_KERNEL(gemm32_f32, dq8_f32, 32, 128)
GEMM_KERNEL(gemm32_f16, dq8_f16, 32, 128)
GEMM_KERNEL(gemm32_bf16, dq8_bf16, 32, 128)
GEMM_KERNEL(gemm32_q8_0, dq8_q8_0, 32, 128)
GEMM_KERNEL(gemm32_q4_0, dq8_q4_0, 32, 128)
GEMM_KERNEL(gemm32_q4_k, dq8_q4_k, 32, 128)
GEMM_KERNEL(gemm32_q5_k, dq8_q5_k, 32, 128)
GEMM_KERNEL(gemm32_q6_k, dq8_q6_k, 32, 128)

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
