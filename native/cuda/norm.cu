// norm.cu: row normalisations and rotary embedding, one block of 256 threads per row.
// Rows are addressed as (token t, sub-row h): x + t*ldx + h*hsx, so per-head norms read
// strided heads in place (the query half of attn_q's [query | gate] pairs, for one).
// Reductions go through shared memory (no warp shuffles).
#include "fermi.cuh"

#define NORM_THREADS 256

__device__ float block_sum(float v, float* red) {
    const int tid = threadIdx.x;
    red[tid] = v;
    __syncthreads();
    for (int s = NORM_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        __syncthreads();
    }
    float total = red[0];
    __syncthreads();
    return total;
}

// y = x / sqrt(mean(x^2) + eps) * w   (w as stored: 1 + w for the zero-centred norms)
extern "C" __global__ void rms_norm(const float* x, int ldx, int hsx, float* y, int ldy, int hsy,
                                    const float* w, int per, int dim, float eps)
{
    __shared__ float red[NORM_THREADS];
    const int r = blockIdx.x, t = r / per, h = r % per;
    const float* xr = x + (long long)t * ldx + (long long)h * hsx;
    float* yr = y + (long long)t * ldy + (long long)h * hsy;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) ss += xr[i] * xr[i];
    float inv = rsqrtf(block_sum(ss, red) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) yr[i] = xr[i] * inv * w[i];
}

// Gated DeltaNet output norm, per value head: y = x / rms(x) * w * silu(z)
extern "C" __global__ void rms_norm_gated(const float* x, const float* z, float* y, const float* w,
                                          int dim, float eps)
{
    __shared__ float red[NORM_THREADS];
    const long long base = (long long)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) ss += x[base + i] * x[base + i];
    float inv = rsqrtf(block_sum(ss, red) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS)
        y[base + i] = x[base + i] * inv * w[i] * fm_silu(z[base + i]);
}

// in place: x = x / sqrt(sum(x^2) + eps) * scale
extern "C" __global__ void l2_norm(float* x, int ldx, int per, int dim, float eps, float scale)
{
    __shared__ float red[NORM_THREADS];
    const int r = blockIdx.x, t = r / per, h = r % per;
    float* xr = x + (long long)t * ldx + (long long)h * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) ss += xr[i] * xr[i];
    float f = rsqrtf(block_sum(ss, red) + eps) * scale;
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) xr[i] *= f;
}

// NeoX rotate-half on the first rope_dim dims of every head, in place.
// x: [T, heads, hd] with row stride ldx; cs: [T, rope_dim/2, 2] (cos, sin) per position.
extern "C" __global__ void rope_neox(float* x, int ldx, int heads, int hd, int rope_dim,
                                     const float* cs, int T)
{
    const int half = rope_dim / 2;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)T * heads * half) return;
    const int j = (int)(i % half), h = (int)((i / half) % heads), t = (int)(i / ((long long)half * heads));
    float* p = x + (long long)t * ldx + (long long)h * hd;
    const float c = cs[((long long)t * half + j) * 2], s = cs[((long long)t * half + j) * 2 + 1];
    const float a = p[j], b = p[j + half];
    p[j] = a * c - b * s;
    p[j + half] = b * c + a * s;
}
