// attention.cu: tiled causal attention with GQA and the sigmoid output gate, for prefill.
// One block per (16 queries, head); keys stream through shared memory 8 at a time with an
// online softmax, so any context length fits. Queries are already RMS-normed and rotated;
// the caches hold the new keys and values at rows pos0..pos0+T-1. head_dim <= 256, % 16 == 0.
#include "fermi.cuh"

#define ATT_Q 16
#define ATT_K 8
#define ATT_MAX_HD 256

// q: [T, nh, hd]; kc, vc: [ctx, nkv, hd]; gate: row t, head h at gate + t*ldg + h*hsg;
// out: [T, nh * hd]. Query t sits at absolute position pos0 + t and sees keys 0..pos0+t.
extern "C" __global__ void attn_prefill(const float* q, const float* kc, const float* vc,
                                        const float* gate, int ldg, int hsg, float* out,
                                        int T, int pos0, int nh, int nkv, int hd, float scale)
{
    __shared__ float qs[ATT_Q][ATT_MAX_HD];
    __shared__ float ks[ATT_K][ATT_MAX_HD + 1];
    __shared__ float vs[ATT_K][ATT_MAX_HD];
    __shared__ float sp[ATT_Q][16];

    const int q0 = blockIdx.x * ATT_Q, h = blockIdx.y, kvh = h / (nh / nkv), tid = threadIdx.x;
    const int qi = tid >> 4, lane = tid & 15, kj = lane & 7, half = lane >> 3;
    const int nd = hd / 16, hh = hd / 2;
    const int kvld = nkv * hd;

    for (int i = tid; i < ATT_Q * hd; i += 256) {
        int r = i / hd, d = i % hd;
        qs[r][d] = q0 + r < T ? q[((long long)(q0 + r) * nh + h) * hd + d] : 0.0f;
    }
    const int qpos = pos0 + q0 + qi;
    const int kend = min(pos0 + T, pos0 + q0 + ATT_Q);     // keys this tile can see
    float acc[ATT_MAX_HD / 16];
    #pragma unroll
    for (int m = 0; m < ATT_MAX_HD / 16; ++m) acc[m] = 0.0f;
    float mx = -1e30f, l = 0.0f;

    for (int k0 = 0; k0 < kend; k0 += ATT_K) {
        __syncthreads();
        for (int i = tid; i < ATT_K * hd; i += 256) {
            int r = i / hd, d = i % hd;
            bool ok = k0 + r < kend;
            long long off = (long long)(k0 + r) * kvld + kvh * hd + d;
            ks[r][d] = ok ? kc[off] : 0.0f;
            vs[r][d] = ok ? vc[off] : 0.0f;
        }
        __syncthreads();
        float part = 0.0f;
        for (int d = half * hh; d < (half + 1) * hh; ++d) part += qs[qi][d] * ks[kj][d];
        sp[qi][lane] = part;
        __syncthreads();

        float s[ATT_K], tmax = mx;
        for (int j = 0; j < ATT_K; ++j) {
            s[j] = k0 + j <= qpos && k0 + j < kend ? (sp[qi][j] + sp[qi][j + 8]) * scale : -1e30f;
            tmax = fmaxf(tmax, s[j]);
        }
        const float corr = expf(mx - tmax);
        l *= corr;
        #pragma unroll
        for (int m = 0; m < ATT_MAX_HD / 16; ++m) acc[m] *= corr;
        for (int j = 0; j < ATT_K; ++j) {
            float p = s[j] > -1e29f ? expf(s[j] - tmax) : 0.0f;
            l += p;
            #pragma unroll
            for (int m = 0; m < ATT_MAX_HD / 16; ++m)
                if (m < nd) acc[m] += p * vs[j][lane + 16 * m];
        }
        mx = tmax;
    }

    const int t = q0 + qi;
    if (t < T) {
        const float inv = 1.0f / l;
        const float* gr = gate + (long long)t * ldg + (long long)h * hsg;
        float* orow = out + ((long long)t * nh + h) * hd;
#pragma unroll
        for (int m = 0; m < ATT_MAX_HD / 16; ++m) {
            int d = lane + 16 * m;
            if (m < nd) orow[d] = acc[m] * inv * fm_sigmoid(gr[d]);
        }
    }
}
