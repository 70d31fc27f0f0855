/* Causal attention (ops.h: fm_attn_tiled), the plain-C reference of the SIMD siblings
 * attn_tiled_{ssse3,avx2,avx512}.c (attn_tiled_body.h), and the block sizes that they and the
 * engine share. The same blocks, key-block conversion and online softmax as the siblings, one
 * row and one key at a time, with libm's expf. The split decode over the pool is
 * attn_decode.c. */
#include <math.h>
#include <stddef.h>
#include <string.h>
#include "fermium_cpu.h"
#include "ops.h"

int fm_attn_block_tokens(int group) {
    return group >= FM_ATTN_ROWS ? 1 : FM_ATTN_ROWS / group;
}

// rows of a block rounded up to the siblings' tiles of 4
static size_t padded_rows(int group) {
    return ((size_t)fm_attn_block_tokens(group) * group + 3) & ~(size_t)3;
}

// a key block of K and V in f32, then the rows' scores, O, m and l
size_t fm_attn_tiled_work(int group, int hd) {
    return 2 * (size_t)FM_ATTN_KEYS * hd + padded_rows(group) * (FM_ATTN_KEYS + (size_t)hd + 2);
}

static float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// the ni tokens from i0: O (rows, hd) accumulates the values weighted by e^(s - m), l the weights
static void block(FM_ATTN_ARGS, int i0, int ni) {
    const int rows = ni * group, kend = pos0 + i0 + ni < key1 ? pos0 + i0 + ni : key1;
    float *Kf = work, *Vf = Kf + (size_t)FM_ATTN_KEYS * hd, *s = Vf + (size_t)FM_ATTN_KEYS * hd;
    float *O = s + FM_ATTN_KEYS, *m = O + (size_t)rows * hd, *l = m + rows;
    memset(O, 0, sizeof(float) * (size_t)rows * hd);
    for (int r = 0; r < rows; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
    for (int kb = key0; kb < kend; kb += FM_ATTN_KEYS) {
        const int jn = kend - kb < FM_ATTN_KEYS ? kend - kb : FM_ATTN_KEYS;
        const int seen = pos0 + i0 + ni - kb < jn ? pos0 + i0 + ni - kb : jn;   // by the last row
        for (int j = 0; j < seen; j++) {
            fm_kv_load(kv_type, (const char *)k + (size_t)(kb + j) * kv_stride, Kf + (size_t)j * hd, hd);
            fm_kv_load(kv_type, (const char *)v + (size_t)(kb + j) * kv_stride, Vf + (size_t)j * hd, hd);
        }
        for (int r = 0; r < rows; r++) {
            const int i = i0 + r / group, g = r % group, p = pos0 + i;
            const int valid = p - kb + 1 < jn ? p - kb + 1 : jn;   // keys up to position p
            if (valid <= 0) continue;
            const float *qr = q + (size_t)i * q_tok + (size_t)g * q_head;
            float mx = m[r];
            for (int j = 0; j < valid; j++) {
                s[j] = dot(qr, Kf + (size_t)j * hd, hd) * scale;
                mx = s[j] > mx ? s[j] : mx;
            }
            const float alpha = expf(m[r] - mx);
            float *Or = O + (size_t)r * hd;
            l[r] *= alpha;
            for (int d = 0; d < hd; d++) Or[d] *= alpha;
            for (int j = 0; j < valid; j++) {
                const float pj = expf(s[j] - mx);
                const float *vj = Vf + (size_t)j * hd;
                l[r] += pj;
                for (int d = 0; d < hd; d++) Or[d] += pj * vj[d];
            }
            m[r] = mx;
        }
    }
    for (int r = 0; r < rows; r++) {
        const int i = i0 + r / group, g = r % group;
        float *out = o + (size_t)i * o_tok + (size_t)g * o_head;
        if (ml) {                               // a split's part: fm_attn_decode merges them
            memcpy(out, O + (size_t)r * hd, sizeof(float) * (size_t)hd);
            ml[2 * ((size_t)i0 * group + r)] = m[r];
            ml[2 * ((size_t)i0 * group + r) + 1] = l[r];
        } else {
            for (int d = 0; d < hd; d++) out[d] = O[(size_t)r * hd + d] / l[r];
        }
    }
}

void fm_attn_tiled_generic(FM_ATTN_ARGS) {
    const int bq = fm_attn_block_tokens(group);
    for (int i0 = 0; i0 < nq; i0 += bq) block(FM_ATTN_PASS, i0, nq - i0 < bq ? nq - i0 : bq);
}
