// deltanet.cu: the chunked Gated DeltaNet scan (chunks of 64 tokens) with its recurrent state.
//
// Per value head h with key head kh, inside chunk c (rows i, j < 64, G = cumsum of g):
//   A[i][j]   = beta_i (k_i . k_j) exp(G_i - G_j)         j < i      (strictly lower)
//   Tm        = (I + A)^-1                                 (unit lower triangular)
//   U         = Tm (beta * v)        Wk = Tm (beta * exp(G) * k)
//   Aqk[i][j] = (q_i . k_j) exp(G_i - G_j)                 j <= i
// then, sequentially over chunks, with S: [dk, dv]:
//   vnew = U - Wk S;   o = exp(G) * (q S) + Aqk vnew
//   S    = exp(G_last) S + (exp(G_last - G) * k)^T vnew
// gdn_chunk_prep runs every (chunk, head) in parallel; gdn_chunk_scan walks the chunks for a
// 32-wide slice of dv (the delta rule keeps the columns of S independent).
// q and k arrive L2-normalised (q scaled by 1/sqrt(dk)); dk <= 128.
#include "fermi.cuh"

#define GDN_C 64
#define GDN_TILE 32
#define GDN_MAX_DK 128

struct GdnShape {
    int T, C;          // tokens, row stride of qkv (conv channels)
    int nk, nv, dk, dv;
    int tiled;         // value head h reads key head h % nk (tiled) or h / (nv / nk) (grouped)
};

__device__ __forceinline__ int gdn_key_head(const GdnShape& s, int h) {
    return s.tiled ? h % s.nk : h / (s.nv / s.nk);
}

// ---------------------------------------------------------------------------- per (chunk, head)
// qkv: [T, C] = [q (nk*dk) | k (nk*dk) | v (nv*dv)]; g, beta: [T, nv]
// out: gcum [nv, nch, 64], aqk [nv, nch, 64, 64], u [nv, nch, 64, dv], wk [nv, nch, 64, dk]
extern "C" __global__ void gdn_chunk_prep(const float* qkv, const float* g, const float* beta,
                                          int T, int C, int nk, int nv, int dk, int dv, int tiled,
                                          float* gcum, float* aqk, float* u, float* wk)
{
    const GdnShape s = {T, C, nk, nv, dk, dv, tiled};
    __shared__ float gc[GDN_C], bt[GDN_C];
    __shared__ float A[GDN_C][GDN_C + 1];
    __shared__ float ta[GDN_C][GDN_TILE + 1], tb[GDN_C][GDN_TILE + 1];

    const int c = blockIdx.x, h = blockIdx.y, nch = gridDim.x, tid = threadIdx.x;
    const int t0 = c * GDN_C, kh = gdn_key_head(s, h);
    const float* qb = qkv + kh * s.dk;
    const float* kb = qkv + s.nk * s.dk + kh * s.dk;
    const float* vb = qkv + 2 * s.nk * s.dk + h * s.dv;
    const long long hc = (long long)h * nch + c;

    if (tid < GDN_C) {
        int t = t0 + tid;
        gc[tid] = t < s.T ? g[(long long)t * s.nv + h] : 0.0f;
        bt[tid] = t < s.T ? beta[(long long)t * s.nv + h] : 0.0f;
    }
    __syncthreads();
    if (tid == 0)
        for (int i = 1; i < GDN_C; ++i) gc[i] += gc[i - 1];
    __syncthreads();
    if (tid < GDN_C) gcum[hc * GDN_C + tid] = gc[tid];

    // 4 x 4 micro-tiles of the 64 x 64 products
    const int ri = (tid >> 4) * 4, cj = (tid & 15) * 4;
    const int lr = tid >> 2, lc = (tid & 3) * 8;           // loader: row, 8 columns
    const bool live = t0 + lr < s.T;
    for (int pass = 0; pass < 2; ++pass) {                  // 0: k k^T -> A, 1: q k^T -> aqk
        float acc[4][4];
        for (int a = 0; a < 4; ++a)
            for (int b = 0; b < 4; ++b) acc[a][b] = 0.0f;
        const float* left = pass == 0 ? kb : qb;
        for (int d0 = 0; d0 < s.dk; d0 += GDN_TILE) {
            for (int e = 0; e < 8; ++e) {
                long long off = (long long)(t0 + lr) * s.C + d0 + lc + e;
                ta[lr][lc + e] = live ? left[off] : 0.0f;
                tb[lr][lc + e] = live ? kb[off] : 0.0f;
            }
            __syncthreads();
            for (int d = 0; d < GDN_TILE; ++d)
                for (int a = 0; a < 4; ++a)
                    for (int b = 0; b < 4; ++b) acc[a][b] += ta[ri + a][d] * tb[cj + b][d];
            __syncthreads();
        }
        for (int a = 0; a < 4; ++a)
            for (int b = 0; b < 4; ++b) {
                int i = ri + a, j = cj + b;
                float decay = expf(fminf(gc[i] - gc[j], 0.0f));
                if (pass == 0) A[i][j] = j < i ? bt[i] * acc[a][b] * decay : 0.0f;
                else aqk[(hc * GDN_C + i) * GDN_C + j] = j <= i ? acc[a][b] * decay : 0.0f;
            }
    }
    __syncthreads();

    // (I + A)^-1 in place, row by row: T[i][j] = -sum_{j <= m < i} A[i][m] T[m][j]
    for (int i = 1; i < GDN_C; ++i) {
        float v = 0.0f;
        if (tid < i) {
            v = -A[i][tid];
            for (int m = tid + 1; m < i; ++m) v -= A[i][m] * A[m][tid];
        }
        __syncthreads();
        if (tid < i) A[i][tid] = v;
        __syncthreads();
    }
    if (tid < GDN_C) {
        A[tid][tid] = 1.0f;
        for (int j = tid + 1; j < GDN_C; ++j) A[tid][j] = 0.0f;
    }
    __syncthreads();

    // U = Tm (beta v), Wk = Tm (beta exp(G) k), 32 columns at a time
    const int col = tid & 31, row0 = tid >> 5;
    for (int which = 0; which < 2; ++which) {
        const int width = which == 0 ? s.dv : s.dk;
        const float* src = which == 0 ? vb : kb;
        float* dst = (which == 0 ? u : wk) + hc * GDN_C * width;
        for (int j0 = 0; j0 < width; j0 += GDN_TILE) {
            for (int e = 0; e < 8; ++e) {
                int m = row0 + 8 * e;
                float scale = which == 0 ? bt[m] : bt[m] * expf(gc[m]);
                ta[m][col] = t0 + m < s.T ? src[(long long)(t0 + m) * s.C + j0 + col] * scale : 0.0f;
            }
            __syncthreads();
            for (int e = 0; e < 8; ++e) {
                int i = row0 + 8 * e;
                float acc = 0.0f;
                for (int m = 0; m <= i; ++m) acc += A[i][m] * ta[m][col];
                dst[(long long)i * width + j0 + col] = acc;
            }
            __syncthreads();
        }
    }
}

// ---------------------------------------------------------------------------- sequential scan
// grid (nv, dv / 32). state: [nv, dk, dv] in/out; o: [T, nv * dv]
extern "C" __global__ void gdn_chunk_scan(const float* qkv,
                                          int T, int C, int nk, int nv, int dk, int dv, int tiled,
                                          const float* gcum, const float* aqk, const float* u,
                                          const float* wk, float* state, float* o, int nch)
{
    const GdnShape s = {T, C, nk, nv, dk, dv, tiled};
    __shared__ float S[GDN_MAX_DK][GDN_TILE + 1];
    __shared__ float vn[GDN_C][GDN_TILE + 1];
    __shared__ float gc[GDN_C], wdecay[GDN_C];

    const int h = blockIdx.x, j0 = blockIdx.y * GDN_TILE, tid = threadIdx.x;
    const int col = tid & 31, row0 = tid >> 5;
    const int kh = gdn_key_head(s, h);
    const float* qb = qkv + kh * s.dk;
    const float* kb = qkv + s.nk * s.dk + kh * s.dk;
    float* sg = state + (long long)h * s.dk * s.dv + j0 + col;

    for (int kk = row0; kk < s.dk; kk += 8) S[kk][col] = sg[(long long)kk * s.dv];
    __syncthreads();

    for (int c = 0; c < nch; ++c) {
        const long long hc = (long long)h * nch + c;
        const int t0 = c * GDN_C;
        if (tid < GDN_C) gc[tid] = gcum[hc * GDN_C + tid];
        __syncthreads();
        if (tid < GDN_C) wdecay[tid] = expf(gc[GDN_C - 1] - gc[tid]);

        // vnew = U - Wk S
        const float* ur = u + hc * GDN_C * s.dv + j0 + col;
        const float* wr = wk + hc * GDN_C * s.dk;
        for (int e = 0; e < 8; ++e) {
            int i = row0 + 8 * e;
            float acc = ur[(long long)i * s.dv];
            for (int kk = 0; kk < s.dk; ++kk) acc -= wr[(long long)i * s.dk + kk] * S[kk][col];
            vn[i][col] = acc;
        }
        __syncthreads();

        // o = exp(G) (q S) + Aqk vnew
        const float* ar = aqk + hc * GDN_C * GDN_C;
        for (int e = 0; e < 8; ++e) {
            int i = row0 + 8 * e, t = t0 + i;
            if (t >= s.T) break;
            const float* q = qb + (long long)t * s.C;
            float inter = 0.0f, intra = 0.0f;
            for (int kk = 0; kk < s.dk; ++kk) inter += q[kk] * S[kk][col];
            for (int m = 0; m <= i; ++m) intra += ar[i * GDN_C + m] * vn[m][col];
            o[(long long)t * s.nv * s.dv + h * s.dv + j0 + col] = expf(gc[i]) * inter + intra;
        }
        __syncthreads();

        // S = exp(G_last) S + (exp(G_last - G) k)^T vnew
        const float glast = expf(gc[GDN_C - 1]);
        for (int kk = row0; kk < s.dk; kk += 8) {
            float acc = glast * S[kk][col];
            for (int i = 0; i < GDN_C && t0 + i < s.T; ++i)
                acc += kb[(long long)(t0 + i) * s.C + kk] * wdecay[i] * vn[i][col];
            S[kk][col] = acc;
        }
        __syncthreads();
    }
    for (int kk = row0; kk < s.dk; kk += 8) sg[(long long)kk * s.dv] = S[kk][col];
}
