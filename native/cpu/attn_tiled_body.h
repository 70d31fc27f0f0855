/* Causal attention (ops.h: fm_attn_tiled) in VW-float vectors; included by attn_tiled_ssse3.c,
 * attn_tiled_avx2.c and attn_tiled_avx512.c after they define the vector type and operations:
 *   V, VW, VLOAD, VSTORE, VSET1, VZERO, VADD, VSUB, VMUL, VMAX, VMIN, VFMA(a, b, c) = a * b + c,
 *   VHSUM, VHMAX (to a float), VPOW2I (2^k of integral floats k in [-126, 127]),
 *   KV_ROW_F32(kv_type, src, dst, n): n values of an f16 or q8_0 cache row to floats.
 * An f16 or q8_0 key block is converted to f32 once, into the work, for all the block's rows; an
 * f32 cache is read in place. A block is up to FM_ATTN_ROWS (token, head) rows, padded to tiles of 4 rows; for each block of
 * FM_ATTN_KEYS keys: the scores in tiles of 4 rows x 2 keys (each K row loaded once for 4 query
 * rows), the online softmax row by row over the key block, then O += P V in tiles of 4 rows x
 * 2 vectors (each V row loaded once for 4 rows). Tiles stop at the last key that their last
 * row sees, so the diagonal blocks do about half the work. hd must be a multiple of 2 VW. */
#ifndef FERMIUM_ATTN_TILED_BODY_H
#define FERMIUM_ATTN_TILED_BODY_H

#include <math.h>
#include <stddef.h>
#include <string.h>
#include "fermium_cpu.h"
#include "ops.h"

#include "vexp_body.h"

// s[a * FM_ATTN_KEYS + b] = scale * qr[a] . (k0, k1)[b] for the 4 rows a
static inline __attribute__((always_inline)) void qk_tile(const float *const *qr, const float *k0, const float *k1,
                                                          int hd, float scale, float *s) {
    V acc[4][2];
    _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++) acc[a][0] = acc[a][1] = VZERO;
    for (int d = 0; d < hd; d += VW) {
        const V x0 = VLOAD(k0 + d), x1 = VLOAD(k1 + d);
        _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++) {
            const V y = VLOAD(qr[a] + d);
            acc[a][0] = VFMA(y, x0, acc[a][0]);
            acc[a][1] = VFMA(y, x1, acc[a][1]);
        }
    }
    _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++) {
        s[a * FM_ATTN_KEYS] = VHSUM(acc[a][0]) * scale;
        s[a * FM_ATTN_KEYS + 1] = VHSUM(acc[a][1]) * scale;
    }
}

// O[4 rows, 2 vectors from d] = O alpha + P[4 rows, :jt] V[:jt, d..]
static inline __attribute__((always_inline)) void pv_tile(float *O, int hd, const float *P, const float *alpha,
                                                          const float *vd, size_t kv_tok, int jt) {
    V acc[4][2];
    _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++) {
        const V al = VSET1(alpha[a]);
        acc[a][0] = VMUL(VLOAD(O + (size_t)a * hd), al);
        acc[a][1] = VMUL(VLOAD(O + (size_t)a * hd + VW), al);
    }
    for (int j = 0; j < jt; j++) {
        const float *vj = vd + (size_t)j * kv_tok;
        const V x0 = VLOAD(vj), x1 = VLOAD(vj + VW);
        _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++) {
            const V p = VSET1(P[a * FM_ATTN_KEYS + j]);
            acc[a][0] = VFMA(p, x0, acc[a][0]);
            acc[a][1] = VFMA(p, x1, acc[a][1]);
        }
    }
    _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++) {
        VSTORE(O + (size_t)a * hd, acc[a][0]);
        VSTORE(O + (size_t)a * hd + VW, acc[a][1]);
    }
}

// row r's scores (its first `valid` of jn) -> weights e^(s - m) in place, zero past `valid`;
// updates m and l and returns the factor e^(m_old - m_new) of its O
static inline __attribute__((always_inline)) float softmax_row(float *s, int valid, float *m, float *l) {
    const int vend = valid - valid % VW;
    float mx = *m;
    if (vend) {
        V vm = VLOAD(s);
        for (int j = VW; j < vend; j += VW) vm = VMAX(vm, VLOAD(s + j));
        const float b = VHMAX(vm);
        mx = b > mx ? b : mx;
    }
    for (int j = vend; j < valid; j++) mx = s[j] > mx ? s[j] : mx;
    const V vmx = VSET1(mx);
    V sum = VZERO;
    for (int j = 0; j < vend; j += VW) {
        const V p = vexp(VSUB(VLOAD(s + j), vmx));
        VSTORE(s + j, p);
        sum = VADD(sum, p);
    }
    float tail = 0.0f;
    for (int j = vend; j < valid; j++) tail += s[j] = fm_expf(s[j] - mx);
    for (int j = valid; j < FM_ATTN_KEYS; j++) s[j] = 0.0f;
    const float alpha = fm_expf(*m - mx);     // the first key block: 0 (m = -inf), times O = 0
    *l = *l * alpha + VHSUM(sum) + tail;
    *m = mx;
    return alpha;
}

// rows j < n of a key block (stride bytes apart from src) to floats, hd apart from dst
static inline void kv_block_f32(int kv_type, const char *src, size_t stride, int n, int hd, float *dst) {
    for (int j = 0; j < n; j++) KV_ROW_F32(kv_type, src + (size_t)j * stride, dst + (size_t)j * hd, hd);
}

// the block in two copies: an f32 cache read in place, another type's converted (`convert`)
static inline __attribute__((always_inline)) void attn_block(FM_ATTN_ARGS, int i0, int ni, const int convert) {
    const int rows = ni * group, rp = (rows + 3) & ~3;
    const int kend = pos0 + i0 + ni < key1 ? pos0 + i0 + ni : key1;
    float *Kf = work, *Vf = Kf + (size_t)FM_ATTN_KEYS * hd, *S = Vf + (size_t)FM_ATTN_KEYS * hd;
    float *O = S + (size_t)rp * FM_ATTN_KEYS, *m = O + (size_t)rp * hd, *l = m + rp;
    const float *qr[rp];
    int pr[rp];          // each row's position; the padding repeats the last row
    float alpha[rp];
    for (int r = 0; r < rp; r++) {
        const int rr = r < rows ? r : rows - 1, i = i0 + rr / group;
        qr[r] = q + (size_t)i * q_tok + (size_t)(rr % group) * q_head;
        pr[r] = pos0 + i;
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(O, 0, sizeof(float) * (size_t)rp * hd);
    for (int kb = key0; kb < kend; kb += FM_ATTN_KEYS) {
        const int jn = kend - kb < FM_ATTN_KEYS ? kend - kb : FM_ATTN_KEYS;
        const int seen = pr[rp - 1] - kb + 1 < jn ? pr[rp - 1] - kb + 1 : jn;   // by the last row
        const float *kk = Kf, *vv = Vf;
        const size_t kv_tok = convert ? (size_t)hd : kv_stride / sizeof(float);
        if (!convert) {
            kk = (const float *)((const char *)k + (size_t)kb * kv_stride);
            vv = (const float *)((const char *)v + (size_t)kb * kv_stride);
        } else {
            kv_block_f32(kv_type, (const char *)k + (size_t)kb * kv_stride, kv_stride, seen, hd, Kf);
            kv_block_f32(kv_type, (const char *)v + (size_t)kb * kv_stride, kv_stride, seen, hd, Vf);
        }
        for (int r = 0; r < rp; r += 4) {       // rows come in position order: the last sees most
            const int jt = pr[r + 3] - kb + 1 < jn ? pr[r + 3] - kb + 1 : jn;
            for (int j = 0; j < jt; j += 2) {
                const int j1 = j + 1 < jt ? j + 1 : j;
                qk_tile(qr + r, kk + (size_t)j * kv_tok, kk + (size_t)j1 * kv_tok, hd, scale,
                        S + (size_t)r * FM_ATTN_KEYS + j);
            }
        }
        for (int r = 0; r < rp; r++) {
            const int valid = pr[r] - kb + 1 < jn ? pr[r] - kb + 1 : jn;
            if (valid > 0) {
                alpha[r] = softmax_row(S + (size_t)r * FM_ATTN_KEYS, valid, m + r, l + r);
            } else {
                memset(S + (size_t)r * FM_ATTN_KEYS, 0, sizeof(float) * FM_ATTN_KEYS);
                alpha[r] = 1.0f;
            }
        }
        for (int r = 0; r < rp; r += 4) {
            const int jt = pr[r + 3] - kb + 1 < jn ? pr[r + 3] - kb + 1 : jn;
            if (jt <= 0) continue;              // no row of the tile sees these keys: alpha is 1
            for (int d = 0; d < hd; d += 2 * VW)
                pv_tile(O + (size_t)r * hd + d, hd, S + (size_t)r * FM_ATTN_KEYS, alpha + r, vv + d, kv_tok, jt);
        }
    }
    for (int r = 0; r < rows; r++) {
        float *out = o + (size_t)(i0 + r / group) * o_tok + (size_t)(r % group) * o_head;
        if (ml) {                               // a split's part: fm_attn_decode merges them
            memcpy(out, O + (size_t)r * hd, sizeof(float) * (size_t)hd);
            ml[2 * ((size_t)i0 * group + r)] = m[r];
            ml[2 * ((size_t)i0 * group + r) + 1] = l[r];
            continue;
        }
        const V inv = VSET1(1.0f / l[r]);
        for (int d = 0; d < hd; d += VW) VSTORE(out + d, VMUL(VLOAD(O + (size_t)r * hd + d), inv));
    }
}

static void attn_tiled(FM_ATTN_ARGS) {
    if (hd % (2 * VW)) {                        // no whole tiles of the head dimension
        fm_attn_tiled_generic(FM_ATTN_PASS);
        return;
    }
    const int bq = fm_attn_block_tokens(group);
    for (int i0 = 0; i0 < nq; i0 += bq) {
        if (kv_type == FM_KV_F32) attn_block(FM_ATTN_PASS, i0, nq - i0 < bq ? nq - i0 : bq, 0);
        else attn_block(FM_ATTN_PASS, i0, nq - i0 < bq ? nq - i0 : bq, 1);
    }
}

#endif
