// attention.cu: causal attention with GQA and the sigmoid output gate, for prefill, flash-style.
// Not here: decode, split keys, half arithmetic, shuffles. fp32 throughout, an online softmax, so
// any context length fits. Queries are already RMS-normed and rotated; the caches hold the new
// keys and values at rows pos0..pos0+T-1. head_dim <= ATT_MAX_HD, a multiple of ATT_DC.
//
// A block of 512 threads takes ATT_BQ query rows of one KV head. A row is a (token, query head of
// the group) pair, token-major, so the heads that share a KV head share each K and V tile that
// the block loads. Keys come in tiles of ATT_BK, each in three steps:
//   S = Q K^T   head dim streams 16 at a time through two shared stages, Q and K both d-major,
//               the next chunk in registers while this one is computed (one barrier a chunk);
//               a thread holds 4 rows x 2 keys, from one float4 and one float2 a step.
//   softmax     scores to shared; warp w reduces keys 8w..8w+7 of every row, row max and sum
//               meet through shared memory. Masking happens here, against the row's token.
//   O += P V    V streams 8 keys at a time through the same stages; a thread holds 4 rows x 4
//               columns of the block's ATT_BQ x head_dim output, from two float4s a key.
// Only a block's last tile reaches past the keys its rows see: its scores there are computed and
// masked, its V stages there are neither loaded nor multiplied.
#include "fermi.cuh"

#define ATT_THREADS 512
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_BQ 32                      // query rows per block
#define ATT_BK 128                     // keys per tile
#define ATT_DC 16                      // head-dim chunk of an S stage
#define ATT_VK 8                       // keys per V stage
#define ATT_MAX_HD 256
#define ATT_QLD (ATT_BQ + 4)           // Q stage row: float4 reads, stores at most 2-way conflicted
#define ATT_KLD (ATT_BK + 2)           // K stage row: float2 reads, conflict-free transposing stores

struct AttStageS {
    float q[2][ATT_DC][ATT_QLD];       // Q chunk, d-major: [stage][d][row]
    float k[2][ATT_DC][ATT_KLD];       // K chunk, d-major: [stage][d][key]
};
struct AttStageV {
    float v[2][ATT_VK][ATT_MAX_HD];    // V rows: [stage][key][d]
};
union AttStages {                      // the S and V steps of a tile take turns
    AttStageS s;
    AttStageV v;
};

__device__ __forceinline__ float4 att_ld4(const float* p, bool ok)
{
    return ok ? *(const float4*)p : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// s[4][2] += 4 Q rows . 2 keys over one chunk; q at the thread's first row, k at its first key
__device__ __forceinline__ void att_qk(float (&s)[4][2], const float* q, const float* k)
{
#pragma unroll
    for (int d = 0; d < ATT_DC; ++d) {
        const float4 a = *(const float4*)(q + d * ATT_QLD);
        const float2 b = *(const float2*)(k + d * ATT_KLD);
        const float aa[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            s[i][0] += aa[i] * b.x;
            s[i][1] += aa[i] * b.y;
        }
    }
}

// o[4][4] += P rows (4) times V columns (4) over one V stage; p at [key 0][first row], v at
// [key 0][first column]
__device__ __forceinline__ void att_pv(float (&o)[4][4], const float* p, const float* v)
{
#pragma unroll
    for (int j = 0; j < ATT_VK; ++j) {
        const float4 a = *(const float4*)(p + j * ATT_BQ);
        const float4 b = *(const float4*)(v + j * ATT_MAX_HD);
        const float aa[4] = {a.x, a.y, a.z, a.w}, bb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int c = 0; c < 4; ++c) o[i][c] += aa[i] * bb[c];
    }
}

// q: [T, nh, hd]; kc, vc: [ctx, nkv, hd]; gate: row t, head h at gate + t*ldg + h*hsg;
// out: [T, nh * hd]. Query t sits at absolute position pos0 + t and sees keys 0..pos0+t.
// Grid: (ceil(T * nh/nkv / ATT_BQ), nkv), ATT_THREADS threads. q, kc, vc 16-byte aligned.
extern "C" __global__ void
attn_prefill(const float* q, const float* kc, const float* vc, const float* gate, int ldg, int hsg,
             float* out, int T, int pos0, int nh, int nkv, int hd, float scale)
{
    __shared__ __align__(16) AttStages st;
    __shared__ __align__(16) float ps[ATT_BK][ATT_BQ];            // scores, then P: [key][row]
    __shared__ float rmax[ATT_WARPS][ATT_BQ], rsum[ATT_WARPS][ATT_BQ];
    __shared__ float corr[ATT_BQ], mrow[ATT_BQ], lsum[ATT_BQ];
    __shared__ int seen[ATT_BQ];                                  // the last key row r sees

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int grp = nh / nkv, kvh = blockIdx.y, rows = T * grp;
    const int row0 = (gridDim.x - 1 - blockIdx.x) * ATT_BQ;       // the blocks that see most keys first
    const int kend = pos0 + (min(row0 + ATT_BQ, rows) - 1) / grp + 1;   // keys the block sees
    const int kvld = nkv * hd, nc = hd / ATT_DC;
    const float* kbase = kc + (long long)kvh * hd;
    const float* vbase = vc + (long long)kvh * hd;

    // loaders: K key tid/4 and 4 d from 4*(tid%4) of a chunk; Q row tid/4 likewise (tid < 4*ATT_BQ);
    // V key tid/(hd/4) of a stage and 4 d from 4*(tid%(hd/4)) (tid < 2*hd)
    const int kj = tid / 4, kq = 4 * (tid % 4), vj = tid / (hd / 4), vq = 4 * (tid % (hd / 4));
    const bool vload = tid < 2 * hd;
    const float* qsrc = q;
    const bool qload = tid < 4 * ATT_BQ && row0 + tid / 4 < rows;
    if (qload) {
        const int r = row0 + tid / 4;
        qsrc = q + ((long long)(r / grp) * nh + kvh * grp + r % grp) * hd + kq;
    }
    // S role: rows 4*(lane%8).., keys 2*(4*warp + lane/8)..; softmax role: row lane
    const int srow = 4 * (lane % 8), skey = 2 * (4 * warp + lane / 8);
    // PV role: rows prow.., columns pcol.. (a warp: 16 rows x 32 columns)
    const int prow = 16 * (warp % 2) + 4 * (lane / 8), pcol = 32 * (warp / 2) + 4 * (lane % 8);
    const bool pbusy = 32 * (warp / 2) < hd;

    float o[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) o[i][c] = 0.0f;
    if (warp == 0) {                                              // row lane: running max, sum, last key
        mrow[lane] = -1e30f;
        lsum[lane] = 0.0f;
        seen[lane] = pos0 + min(row0 + lane, rows - 1) / grp;
    }

    float4 pk = att_ld4(kbase + (long long)kj * kvld + kq, kj < kend);
    float4 pq = att_ld4(qsrc, qload);
    for (int k0 = 0; k0 < kend; k0 += ATT_BK) {
        // ---- S = Q K^T, chunk c of the head dim in stage c & 1
        float s[4][2];
#pragma unroll
        for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = 0.0f;
        __syncthreads();                                          // the last tile's V stages are read
        for (int c = 0;; ++c) {
            const int b = c & 1;
            st.s.k[b][kq][kj] = pk.x;
            st.s.k[b][kq + 1][kj] = pk.y;
            st.s.k[b][kq + 2][kj] = pk.z;
            st.s.k[b][kq + 3][kj] = pk.w;
            if (tid < 4 * ATT_BQ) {
                st.s.q[b][kq][kj] = pq.x;
                st.s.q[b][kq + 1][kj] = pq.y;
                st.s.q[b][kq + 2][kj] = pq.z;
                st.s.q[b][kq + 3][kj] = pq.w;
            }
            __syncthreads();
            if (c + 1 < nc) {
                pk = att_ld4(kbase + (long long)(k0 + kj) * kvld + ATT_DC * (c + 1) + kq, k0 + kj < kend);
                pq = att_ld4(qsrc + ATT_DC * (c + 1), qload);
            } else {
                pk = att_ld4(vbase + (long long)(k0 + vj) * kvld + vq, vload && k0 + vj < kend);
            }
            att_qk(s, &st.s.q[b][0][srow], &st.s.k[b][0][skey]);
            if (c + 1 == nc) break;
        }
        *(float4*)&ps[skey][srow] = make_float4(s[0][0] * scale, s[1][0] * scale, s[2][0] * scale, s[3][0] * scale);
        *(float4*)&ps[skey + 1][srow] = make_float4(s[0][1] * scale, s[1][1] * scale, s[2][1] * scale, s[3][1] * scale);
        __syncthreads();

        // ---- online softmax: warp w takes keys 8w..8w+7 of row lane
        float p[8], mt = -1e30f;
        const int last = seen[lane] - k0 - 8 * warp;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            p[i] = i <= last ? ps[8 * warp + i][lane] : -1e30f;
            mt = fmaxf(mt, p[i]);
        }
        rmax[warp][lane] = mt;
        __syncthreads();
        const float m = mrow[lane];
        float mn = m, sum = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; ++w) mn = fmaxf(mn, rmax[w][lane]);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            p[i] = expf(p[i] - mn);
            ps[8 * warp + i][lane] = p[i];
            sum += p[i];
        }
        rsum[warp][lane] = sum;
        if (warp == 0) corr[lane] = expf(m - mn);
        __syncthreads();
        if (warp == 0) {
            float t = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS; ++w) t += rsum[w][lane];
            lsum[lane] = lsum[lane] * corr[lane] + t;
            mrow[lane] = mn;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float f = corr[prow + i];
#pragma unroll
            for (int c = 0; c < 4; ++c) o[i][c] *= f;
        }

        // ---- O += P V, keys 8c.. of the tile in stage c & 1
        const int nv = (min(ATT_BK, kend - k0) + ATT_VK - 1) / ATT_VK;
        for (int c = 0;; ++c) {
            const int b = c & 1;
            if (vload) *(float4*)&st.v.v[b][vj][vq] = pk;
            __syncthreads();
            const int key = k0 + ATT_VK * (c + 1) + vj;
            if (c + 1 < nv)
                pk = att_ld4(vbase + (long long)key * kvld + vq, vload && key < kend);
            else if (k0 + ATT_BK < kend) {                        // the next tile's first K and Q chunk
                pk = att_ld4(kbase + (long long)(k0 + ATT_BK + kj) * kvld + kq, k0 + ATT_BK + kj < kend);
                pq = att_ld4(qsrc, qload);
            }
            if (pbusy) att_pv(o, &ps[ATT_VK * c][prow], &st.v.v[b][0][pcol]);
            if (c + 1 == nv) break;
        }
    }

    // ---- out = O / l * sigmoid(gate)
    __syncthreads();
    if (pcol >= hd) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = row0 + prow + i;
        if (r >= rows) break;
        const int t = r / grp, h = kvh * grp + r % grp;
        const float inv = 1.0f / lsum[prow + i];
        const float* g = gate + (long long)t * ldg + (long long)h * hsg + pcol;
        float* y = out + ((long long)t * nh + h) * hd + pcol;
#pragma unroll
        for (int c = 0; c < 4; ++c) y[c] = o[i][c] * inv * fm_sigmoid(g[c]);
    }
}
