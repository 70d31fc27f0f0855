// vision.cu: the vision tower's kernels for the prefill GPU (native/cuda/vision.py drives them):
// the batched matmul of an image's patches with a weight matrix in its mmproj type, with the bias,
// GELU and residual add in its epilogue; LayerNorm; the 2D rotary into per-head planes; and the
// attention of every patch over every patch. Not the text model's prefill kernels (gemm.cu,
// attention.cu): those take tile lists of routed tokens, inner widths of whole 32s and a causal
// KV cache; the tower has an FFN of 4304 and heads of 72, and no cache.
// Fermi subset: fp32 only, reductions through shared memory, no shuffles, no __ldg.
#include "quant.cuh"

#define VIS_THREADS 256
#define VIS_BK 32
#define VIS_BM 64        // patches per GEMM block
#define VIS_BN 64        // weight rows per GEMM block
#define VIS_PAD 4
#define VIS_ACT_GELU_TANH 1
#define VIS_ACT_GELU_ERF 2

// ---------------------------------------------------------------------------- GEMM
// Y[n, R] (+)= act(X[n, K] . W[R, K]^T + bias): 64 x 64 outputs per block, 4 x 4 per thread, the
// X tile and the dequantized W tile staged k-major in shared memory 32 columns at a time. K a
// multiple of 8 (of 32 for Q8_0): each loader reads 8 columns, zero past K.
template <void (*DQ)(const unsigned char*, int, float*)>
__device__ __forceinline__ void vis_gemm_body(const float* X, int ldx, float* Y, int ldy, const unsigned char* W,
                                              long long row_bytes, const float* bias, int n, int R, int K,
                                              int accumulate, int act)
{
    __shared__ float xs[VIS_BK][VIS_BM + VIS_PAD];
    __shared__ float ws[VIS_BK][VIS_BN + VIS_PAD];
    const int tid = threadIdx.x, r0 = blockIdx.x * VIS_BN, p0 = blockIdx.y * VIS_BM;
    const int lr = tid >> 2, lk = (tid & 3) * 8;                 // loader: row lr, 8 columns from lk
    const float* xsrc = p0 + lr < n ? X + (long long)(p0 + lr) * ldx : 0;
    const unsigned char* wsrc = r0 + lr < R ? W + (long long)(r0 + lr) * row_bytes : 0;
    const int tm = (tid / (VIS_BN / 4)) * 4, tn = (tid % (VIS_BN / 4)) * 4;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += VIS_BK) {
        const int k = k0 + lk;
        float v[8];
        if (xsrc && k < K) {
            for (int i = 0; i < 8; ++i) v[i] = xsrc[k + i];
        } else {
            for (int i = 0; i < 8; ++i) v[i] = 0.0f;
        }
        for (int i = 0; i < 8; ++i) xs[lk + i][lr] = v[i];
        if (wsrc && k < K) {
            DQ(wsrc, k, v);
        } else {
            for (int i = 0; i < 8; ++i) v[i] = 0.0f;
        }
        for (int i = 0; i < 8; ++i) ws[lk + i][lr] = v[i];
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < VIS_BK; ++kk) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) { a[i] = xs[kk][tm + i]; b[i] = ws[kk][tn + i]; }
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }

    for (int i = 0; i < 4; ++i) {
        const int p = p0 + tm + i;
        if (p >= n) break;
        float* y = Y + (long long)p * ldy;
        for (int j = 0; j < 4; ++j) {
            const int r = r0 + tn + j;
            if (r >= R) break;
            float s = acc[i][j] + (bias ? bias[r] : 0.0f);
            if (act == VIS_ACT_GELU_TANH) {         // 0.5 s (1 + tanh u) = s / (1 + e^(-2u))
                const float u = 0.7978845608f * (s + 0.044715f * s * s * s);
                s = s / (1.0f + expf(-2.0f * u));
            } else if (act == VIS_ACT_GELU_ERF) {
                s = 0.5f * s * (1.0f + erff(s * 0.70710678f));
            }
            y[r] = accumulate ? y[r] + s : s;
        }
    }
}

#define VIS_GEMM_KERNEL(name, dq)                                                                  \
    extern "C" __global__ void name(const float* X, int ldx, float* Y, int ldy, const unsigned char* W, \
                                    long long row_bytes, const float* bias, int n, int R, int K,      \
                                    int accumulate, int act)                                          \
    {                                                                                                 \
        vis_gemm_body<dq>(X, ldx, Y, ldy, W, row_bytes, bias, n, R, K, accumulate, act);              \
    }

VIS_GEMM_KERNEL(vis_gemm_f32, dq8_f32)
VIS_GEMM_KERNEL(vis_gemm_f16, dq8_f16)
VIS_GEMM_KERNEL(vis_gemm_bf16, dq8_bf16)
VIS_GEMM_KERNEL(vis_gemm_q8_0, dq8_q8_0)

// ---------------------------------------------------------------------------- LayerNorm
__device__ float vis_block_sum(float v, float* red)
{
    const int tid = threadIdx.x;
    red[tid] = v;
    __syncthreads();
    for (int s = VIS_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        __syncthreads();
    }
    const float total = red[0];
    __syncthreads();
    return total;
}

// one block per row: y = (x - mean) / sqrt(var + eps) * w + b, rows dim apart (y may alias x)
extern "C" __global__ void vis_layernorm(const float* x, float* y, const float* w, const float* b, int dim,
                                         float eps)
{
    __shared__ float red[VIS_THREADS];
    const float* xr = x + (long long)blockIdx.x * dim;
    float* yr = y + (long long)blockIdx.x * dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += VIS_THREADS) s += xr[i];
    const float mean = vis_block_sum(s, red) / (float)dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += VIS_THREADS) ss += (xr[i] - mean) * (xr[i] - mean);
    const float inv = rsqrtf(vis_block_sum(ss, red) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += VIS_THREADS) yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

// ---------------------------------------------------------------------------- rotary
// qkv[n, 3 heads hd] (q | k | v) -> planes [heads, n, hd]; q and k rotate-half rotated by
// cos, sin [n, hd]. One thread per (patch, head, dim)
extern "C" __global__ void vis_rotary_split(const float* qkv, const float* cs, const float* sn, float* q,
                                            float* k, float* v, int n, int heads, int hd)
{
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int H = heads * hd;
    if (idx >= (long long)n * H) return;
    const int i = (int)(idx / H), h = (int)(idx % H) / hd, d = (int)(idx % hd), half = hd / 2;
    const float* row = qkv + (long long)i * 3 * H + (long long)h * hd;
    const float c = cs[(long long)i * hd + d], s = sn[(long long)i * hd + d];
    const long long at = ((long long)h * n + i) * hd + d;
    const float rq = d < half ? -row[d + half] : row[d - half];
    const float rk = d < half ? -row[H + d + half] : row[H + d - half];
    q[at] = row[d] * c + rq * s;
    k[at] = row[H + d] * c + rk * s;
    v[at] = row[2 * H + d];
}

// ---------------------------------------------------------------------------- attention
#define VA_Q 16
#define VA_K 16
#define VA_MAX_HD 128

// o[n, heads hd] = softmax(scale q k^T) v per head over all n keys. One block per (16 queries,
// head): thread (query tid / 16, lane tid % 16) scores key lane of each tile of 16, the row's
// online softmax goes through shared memory, and the thread keeps dims lane, lane + 16, .. of
// its query's output. hd <= 128.
extern "C" __global__ void vis_attention(const float* q, const float* k, const float* v, float* o, int n,
                                         int heads, int hd, float scale)
{
    __shared__ float qs[VA_Q][VA_MAX_HD];
    __shared__ float ks[VA_K][VA_MAX_HD + 1];
    __shared__ float vs[VA_K][VA_MAX_HD];
    __shared__ float ps[VA_Q][VA_K + 1];
    const int q0 = blockIdx.x * VA_Q, h = blockIdx.y, tid = threadIdx.x, qi = tid >> 4, lane = tid & 15;
    const float *qh = q + (long long)h * n * hd, *kh = k + (long long)h * n * hd, *vh = v + (long long)h * n * hd;
    for (int i = tid; i < VA_Q * hd; i += VIS_THREADS) {
        const int r = i / hd, d = i % hd;
        qs[r][d] = q0 + r < n ? qh[(long long)(q0 + r) * hd + d] * scale : 0.0f;
    }
    float acc[VA_MAX_HD / 16];
#pragma unroll
    for (int m = 0; m < VA_MAX_HD / 16; ++m) acc[m] = 0.0f;
    float mx = -1e30f, l = 0.0f;
    for (int k0 = 0; k0 < n; k0 += VA_K) {
        __syncthreads();
        for (int i = tid; i < VA_K * hd; i += VIS_THREADS) {
            const int r = i / hd, d = i % hd;
            const bool in = k0 + r < n;
            ks[r][d] = in ? kh[(long long)(k0 + r) * hd + d] : 0.0f;
            vs[r][d] = in ? vh[(long long)(k0 + r) * hd + d] : 0.0f;
        }
        __syncthreads();
        const bool valid = k0 + lane < n;
        float s = -1e30f;
        if (valid) {
            s = 0.0f;
            for (int d = 0; d < hd; ++d) s += qs[qi][d] * ks[lane][d];
        }
        ps[qi][lane] = s;
        __syncthreads();
        float m_new = mx;
        for (int j = 0; j < VA_K; ++j) m_new = fmaxf(m_new, ps[qi][j]);
        __syncthreads();
        ps[qi][lane] = valid ? expf(s - m_new) : 0.0f;
        __syncthreads();
        const float alpha = expf(mx - m_new);
        float tile = 0.0f;
        for (int j = 0; j < VA_K; ++j) tile += ps[qi][j];
        l = l * alpha + tile;
        mx = m_new;
#pragma unroll
        for (int m = 0; m < VA_MAX_HD / 16; ++m) {
            const int d = lane + 16 * m;
            if (d < hd) {
                float a = acc[m] * alpha;
                for (int j = 0; j < VA_K; ++j) a += ps[qi][j] * vs[j][d];
                acc[m] = a;
            }
        }
    }
    if (q0 + qi >= n) return;
    float* out = o + (long long)(q0 + qi) * heads * hd + (long long)h * hd;
#pragma unroll
    for (int m = 0; m < VA_MAX_HD / 16; ++m) {
        const int d = lane + 16 * m;
        if (d < hd) out[d] = acc[m] / l;
    }
}
