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
// 16-wide slice of dv (the delta rule keeps the columns of S independent), streaming each
// chunk's operands through shared memory in tiles of 16 rows, double-buffered.
// q and k arrive L2-normalised (q scaled by 1/sqrt(dk)); dk <= 128, dk and dv multiples of 32.
#include "fermi.cuh"

#define GDN_C 64
#define GDN_TILE 32        // prep: key columns per product tile, output columns per solve tile
#define GDN_MAX_DK 128
#define GDN_SLICE 16       // scan: dv columns per block
#define GDN_KT 16          // scan: operand rows per shared tile
#define GDN_AS 65          // row stride of A (odd: column reads spread over the banks)
#define GDN_TS 68          // row stride of Tm^T (a multiple of 4 for float4, 5 banks apart per row)

struct GdnShape {
    int T, C;          // tokens, row stride of qkv (conv channels)
    int nk, nv, dk, dv;
    int tiled;         // value head h reads key head h % nk (tiled) or h / (nv / nk) (grouped)
};

__device__ __forceinline__ int gdn_key_head(const GdnShape& s, int h) {
    return s.tiled ? h % s.nk : h / (s.nv / s.nk);
}
__device__ __forceinline__ float4 gdn_ld4(const float* p) { return *(const float4*)p; }
__device__ __forceinline__ float2 gdn_ld2(const float* p) { return *(const float2*)p; }
__device__ __forceinline__ float4 gdn_scale4(float4 v, float a) {
    return make_float4(v.x * a, v.y * a, v.z * a, v.w * a);
}
__device__ __forceinline__ void gdn_fma42(float acc[4][2], float4 a, float2 b) {      // acc += a b^T
    const float av[4] = {a.x, a.y, a.z, a.w};
    for (int i = 0; i < 4; ++i) {
        acc[i][0] += av[i] * b.x;
        acc[i][1] += av[i] * b.y;
    }
}
__device__ __forceinline__ void gdn_put_column(float* p, int stride, float4 v) {   // v down a column
    p[0] = v.x; p[stride] = v.y; p[2 * stride] = v.z; p[3 * stride] = v.w;
}

// ---------------------------------------------------------------------------- per (chunk, head)
// qkv: [T, C] = [q (nk*dk) | k (nk*dk) | v (nv*dv)]; g, beta: [T, nv]
// out: gcum [nv, nch, 64], aqk [nv, nch, 64 (j), 64 (i)] (Aqk transposed), u [nv, nch, 64, dv],
//      wk [nv, nch, dk, 64] (Wk transposed)
extern "C" __global__ void gdn_chunk_prep(const float* qkv, const float* g, const float* beta,
                                          int T, int C, int nk, int nv, int dk, int dv, int tiled,
                                          float* gcum, float* aqk, float* u, float* wk)
{
    const GdnShape s = {T, C, nk, nv, dk, dv, tiled};
    __shared__ float gc[GDN_C], bt[GDN_C];
    __shared__ __align__(16) float A[GDN_C * GDN_AS];     // A [64][65]; then the solve's rhs tile [64][32]
    __shared__ __align__(16) float W[GDN_C * GDN_TS];     // k^T, q^T tiles [32][64]; then Tm^T [64][68]

    const int c = blockIdx.x, h = blockIdx.y, nch = gridDim.x, tid = threadIdx.x;
    const int t0 = c * GDN_C, kh = gdn_key_head(s, h);
    const float* qb = qkv + kh * s.dk;
    const float* kb = qkv + s.nk * s.dk + kh * s.dk;
    const float* vb = qkv + 2 * s.nk * s.dk + h * s.dv;
    const long long hc = (long long)h * nch + c;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    if (tid < GDN_C) {
        const int t = t0 + tid;
        gc[tid] = t < s.T ? g[(long long)t * s.nv + h] : 0.0f;
        bt[tid] = t < s.T ? beta[(long long)t * s.nv + h] : 0.0f;
    }
    __syncthreads();
    if (tid == 0)
        for (int i = 1; i < GDN_C; ++i) gc[i] += gc[i - 1];
    __syncthreads();
    if (tid < GDN_C) gcum[hc * GDN_C + tid] = gc[tid];

    // k k^T and q k^T together, 4 x 4 micro-tiles, operands as float4 columns of transposed tiles;
    // a warp owns 16 rows x 32 columns, and the two warps above the diagonal skip the products
    const int w = tid >> 5, ri = (w >> 1) * 16 + ((tid >> 3) & 3) * 4, cj = (w & 1) * 32 + (tid & 7) * 4;
    const bool lower = (w & 1) * 32 <= (w >> 1) * 16 + 15;
    float* kT = W;
    float* qT = W + GDN_TILE * GDN_C;
    float aa[4][4] = {}, aq[4][4] = {};
    for (int d0 = 0; d0 < s.dk; d0 += GDN_TILE) {
        for (int e = 0; e < 2; ++e) {                        // a warp stores 32 rows of one column
            const int row = tid & 63, d = 4 * ((tid >> 6) + 4 * e);
            const bool live = t0 + row < s.T;
            const long long off = (long long)(t0 + row) * s.C + d0 + d;
            gdn_put_column(kT + d * GDN_C + row, GDN_C, live ? gdn_ld4(kb + off) : zero);
            gdn_put_column(qT + d * GDN_C + row, GDN_C, live ? gdn_ld4(qb + off) : zero);
        }
        __syncthreads();
#pragma unroll 1
        for (int d = 0; d < GDN_TILE && lower; ++d) {     // unrolled, the loads ahead spill
            const float4 k4 = gdn_ld4(kT + d * GDN_C + ri), q4 = gdn_ld4(qT + d * GDN_C + ri);
            const float4 j4 = gdn_ld4(kT + d * GDN_C + cj);
            const float ki[4] = {k4.x, k4.y, k4.z, k4.w}, qi[4] = {q4.x, q4.y, q4.z, q4.w};
            const float kj[4] = {j4.x, j4.y, j4.z, j4.w};
            for (int a = 0; a < 4; ++a)
                for (int b = 0; b < 4; ++b) {
                    aa[a][b] += ki[a] * kj[b];
                    aq[a][b] += qi[a] * kj[b];
                }
        }
        __syncthreads();
    }
    for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b) {
            const int i = ri + a, j = cj + b;
            const float decay = expf(fminf(gc[i] - gc[j], 0.0f));
            A[i * GDN_AS + j] = j < i ? bt[i] * aa[a][b] * decay : 0.0f;
            aq[a][b] = j <= i ? aq[a][b] * decay : 0.0f;
        }
    for (int b = 0; b < 4; ++b)
        *(float4*)(aqk + (hc * GDN_C + cj + b) * GDN_C + ri) = make_float4(aq[0][b], aq[1][b], aq[2][b], aq[3][b]);
    __syncthreads();

    // (I + A)^-1 by forward substitution, one column per thread, no barrier: column j of Tm is
    // row j of Tm^T, and T[i][j] = -A[i][j] - sum_{j < m < i} A[i][m] T[m][j]
    if (tid < GDN_C) {
        float* tj = W + tid * GDN_TS;
        for (int i = 0; i < GDN_C; ++i) tj[i] = i == tid ? 1.0f : 0.0f;
        for (int i = tid + 1; i < GDN_C; ++i) {
            const float* ai = A + i * GDN_AS;
            float acc0 = -ai[tid], acc1 = 0.0f;              // two chains halve the dependent adds
            int m = tid + 1;
            for (; m + 1 < i; m += 2) {
                acc0 -= ai[m] * tj[m];
                acc1 -= ai[m + 1] * tj[m + 1];
            }
            if (m < i) acc0 -= ai[m] * tj[m];
            tj[i] = acc0 + acc1;
        }
    }
    __syncthreads();

    // U = Tm (beta v), Wk = Tm (beta exp(G) k), 32 columns at a time; 4 rows x 2 columns a thread
    float* R = A;                                            // rhs tile [64][32]
    const int r4 = (tid >> 4) * 4, c2 = (tid & 15) * 2;
    for (int which = 0; which < 2; ++which) {
        const int width = which == 0 ? s.dv : s.dk;
        const float* src = which == 0 ? vb : kb;
        for (int j0 = 0; j0 < width; j0 += GDN_TILE) {
            for (int e = 0; e < 2; ++e) {
                const int f = tid + 256 * e, m = f >> 3, cq = (f & 7) * 4;
                const float scale = which == 0 ? bt[m] : bt[m] * expf(gc[m]);
                const float4 x = t0 + m < s.T ? gdn_ld4(src + (long long)(t0 + m) * s.C + j0 + cq) : zero;
                *(float4*)(R + m * GDN_TILE + cq) = gdn_scale4(x, scale);
            }
            __syncthreads();
            float acc[4][2] = {};
            for (int m = 0; m < (w + 1) * 8; ++m)            // Tm is lower triangular; the warp's last row
                gdn_fma42(acc, gdn_ld4(W + m * GDN_TS + r4), gdn_ld2(R + m * GDN_TILE + c2));
            if (which == 0)
                for (int a = 0; a < 4; ++a)
                    *(float2*)(u + (hc * GDN_C + r4 + a) * s.dv + j0 + c2) = make_float2(acc[a][0], acc[a][1]);
            else
                for (int b = 0; b < 2; ++b)
                    *(float4*)(wk + (hc * s.dk + j0 + c2 + b) * GDN_C + r4) =
                        make_float4(acc[0][b], acc[1][b], acc[2][b], acc[3][b]);
            __syncthreads();
        }
    }
}

// ---------------------------------------------------------------------------- sequential scan
// A chunk is dk / 16 tiles of stage one, [16 kk][Wk^T 64 | q^T 64]: vnew and q S, then four of
// stage two, [16 i][k' dk | Aqk^T 64] with k' = exp(G_last - G) k: the new S and Aqk vnew.
struct GdnScan {
    const float *qb, *kb;                          // this head's q, k columns of qkv
    const float *gcum, *aqk, *u, *wk;              // this head's chunks (u: at this block's slice)
    int T, C, dk, nch;
};

// tile t of chunk c: with b null, fetched into registers (stage one 2 float4 a thread, stage two
// 3: two of k' in 32 float4 slots a row, the used ones below dk, and one of Aqk^T); else stashed
// into shared b, after the compute on the tile before
__device__ __forceinline__ void gdn_tile(const GdnScan& p, int c, int t, int tid, float4 pre[3], float* b) {
    const int n1 = p.dk / GDN_KT, t0 = c * GDN_C;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (c >= p.nch) return;
    if (t < n1) {
        const int kk0 = t * GDN_KT, row = tid & 63, tq = t0 + row;
        if (b) {
            *(float4*)(b + (tid >> 4) * 2 * GDN_C + 4 * (tid & 15)) = pre[0];
            gdn_put_column(b + 4 * (tid >> 6) * 2 * GDN_C + GDN_C + row, 2 * GDN_C, pre[1]);   // q transposed
        } else {
            pre[0] = gdn_ld4(p.wk + (c * p.dk + kk0 + (tid >> 4)) * GDN_C + 4 * (tid & 15));
            pre[1] = tq < p.T ? gdn_ld4(p.qb + (long long)tq * p.C + kk0 + 4 * (tid >> 6)) : zero;
        }
        return;
    }
    const int i0 = (t - n1) * GDN_KT, w2 = p.dk + GDN_C;
    const float glast = p.gcum[t0 + GDN_C - 1];
    for (int e = 0; e < 2; ++e) {
        const int f = tid + 256 * e, i = f >> 5, kq = 4 * (f & 31), tq = t0 + i0 + i;
        if (kq >= p.dk) continue;
        if (b) *(float4*)(b + i * w2 + kq) = pre[e];
        else pre[e] = tq < p.T ? gdn_scale4(gdn_ld4(p.kb + (long long)tq * p.C + kq), expf(glast - p.gcum[tq])) : zero;
    }
    if (b) *(float4*)(b + (tid >> 4) * w2 + p.dk + 4 * (tid & 15)) = pre[2];
    else pre[2] = gdn_ld4(p.aqk + (t0 + i0 + (tid >> 4)) * GDN_C + 4 * (tid & 15));
}

// grid (nv, dv / 16). state: [nv, dk, dv] in/out; o: [T, nv * dv]
extern "C" __global__ void gdn_chunk_scan(const float* qkv,
                                          int T, int C, int nk, int nv, int dk, int dv, int tiled,
                                          const float* gcum, const float* aqk, const float* u,
                                          const float* wk, float* state, float* o, int nch)
{
    const GdnShape s = {T, C, nk, nv, dk, dv, tiled};
    __shared__ __align__(16) float buf[2][GDN_KT * (GDN_MAX_DK + GDN_C)];
    __shared__ __align__(16) float S[GDN_MAX_DK * GDN_SLICE];                        // [dk][16]
    __shared__ __align__(16) float vn[GDN_C * GDN_SLICE], os[GDN_C * GDN_SLICE];     // [64][16]

    const int h = blockIdx.x, j0 = blockIdx.y * GDN_SLICE, tid = threadIdx.x;
    const int r = tid >> 3, c2 = (tid & 7) * 2;              // 4 rows x 2 columns a thread
    const int kh = gdn_key_head(s, h), n1 = s.dk / GDN_KT, w2 = s.dk + GDN_C;
    const bool srow = 4 * r < s.dk;                          // stage two: this thread's S rows exist
    const long long hr = (long long)h * nch * GDN_C;       // this head's first chunk row
    const GdnScan p = {qkv + kh * s.dk, qkv + s.nk * s.dk + kh * s.dk, gcum + hr, aqk + hr * GDN_C,
                       u + hr * s.dv + j0, wk + hr * s.dk, s.T, s.C, s.dk, nch};
    float* sg = state + (long long)h * s.dk * s.dv + j0;
    float* oh = o + h * s.dv + j0;

    for (int f = tid; f < s.dk * GDN_SLICE; f += 256) S[f] = sg[(long long)(f >> 4) * s.dv + (f & 15)];
    float4 pre[3];
    gdn_tile(p, 0, 0, tid, pre, 0);
    gdn_tile(p, 0, 0, tid, pre, buf[0]);
    __syncthreads();

    int tau = 0;                                             // tiles done, over all chunks: the buffer
    for (int c = 0; c < nch; ++c) {
        const int t0 = c * GDN_C;
        // stage one: rows 0..63 Wk S (warps 0-3), rows 64..127 q S (warps 4-7)
        float acc[4][2] = {};
        for (int t = 0; t < n1; ++t, ++tau) {
            gdn_tile(p, c, t + 1, tid, pre, 0);           // in flight during this tile's products
            const float* b = buf[tau & 1];
#pragma unroll
            for (int kk = 0; kk < GDN_KT; ++kk)
                gdn_fma42(acc, gdn_ld4(b + kk * 2 * GDN_C + 4 * r), gdn_ld2(S + (t * GDN_KT + kk) * GDN_SLICE + c2));
            for (int a = 0; a < 4 && t == n1 - 1; ++a) {     // vnew = U - Wk S; os = exp(G) q S
                const int row = (4 * r + a) & 63;
                float* dst = (r < 16 ? vn : os) + row * GDN_SLICE + c2;
                const float2 uu = r < 16 ? gdn_ld2(p.u + (t0 + row) * s.dv + c2) : make_float2(0.0f, 0.0f);
                const float scale = r < 16 ? -1.0f : expf(p.gcum[t0 + row]);
                dst[0] = uu.x + scale * acc[a][0];
                dst[1] = uu.y + scale * acc[a][1];
            }
            gdn_tile(p, c, t + 1, tid, pre, buf[(tau + 1) & 1]);   // the buffer read on the tile before
            __syncthreads();
        }
        // stage two: S rows 4r..4r+3 (below dk), o rows 2r, 2r+1
        float as[4][2] = {}, ao[2][2] = {};
        for (int t = 0; t < 4; ++t, ++tau) {
            const int cn = t == 3 ? c + 1 : c, tn = t == 3 ? 0 : n1 + t + 1;
            gdn_tile(p, cn, tn, tid, pre, 0);             // in flight during this tile's products
            const float* b = buf[tau & 1];
#pragma unroll
            for (int i = 0; i < GDN_KT; ++i) {
                const float2 v2 = gdn_ld2(vn + (t * GDN_KT + i) * GDN_SLICE + c2);
                if (t * GDN_KT <= 8 * (tid >> 5) + 7) {      // Aqk is lower triangular; the warp's last row
                    const float2 a2 = gdn_ld2(b + i * w2 + s.dk + 2 * r);
                    ao[0][0] += a2.x * v2.x; ao[0][1] += a2.x * v2.y;
                    ao[1][0] += a2.y * v2.x; ao[1][1] += a2.y * v2.y;
                }
                if (srow) gdn_fma42(as, gdn_ld4(b + i * w2 + 4 * r), v2);
            }
            if (t == 3) {
                const float decay = expf(p.gcum[t0 + GDN_C - 1]);
                for (int a = 0; a < 4 && srow; ++a)
                    for (int bb = 0; bb < 2; ++bb) {
                        float* sp = S + (4 * r + a) * GDN_SLICE + c2 + bb;
                        *sp = decay * *sp + as[a][bb];
                    }
                for (int a = 0; a < 2; ++a) {
                    const int row = 2 * r + a, tt = t0 + row;
                    const float* op = os + row * GDN_SLICE + c2;
                    if (tt < s.T)
                        *(float2*)(oh + (long long)tt * s.nv * s.dv + c2) =
                            make_float2(op[0] + ao[a][0], op[1] + ao[a][1]);
                }
            }
            gdn_tile(p, cn, tn, tid, pre, buf[(tau + 1) & 1]);
            __syncthreads();
        }
    }
    for (int f = tid; f < s.dk * GDN_SLICE; f += 256) sg[(long long)(f >> 4) * s.dv + (f & 15)] = S[f];
}
