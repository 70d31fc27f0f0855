/* AVX-512 VNNI dot products of a Q6_Kp row (Q6_K repacked, quants.h) with up to FM_DOTN_MAX
 * activation rows in the same order. The block's four 64-byte registers unpack in 7
 * operations (`vpternlogd` merges each shifted pair), and since 32-bit lane k of every register
 * holds sub-block k, `vpdpbusd` sums all four into one register of 16 sub-block sums per
 * activation, scaled once in floats: 4 multiplies per block and activation where the
 * GGUF-layout kernel (qx_batch_avx512.c) takes 8, and 7 unpacking operations where it takes 48.
 * The matvec driver hands it two rows at once (fm_dotr_q6_Kp_a8_avx512).
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni. */
#include <immintrin.h>
#include "quants.h"

#define INLINE static inline __attribute__((always_inline))
#define ACT(i) ((const block_a8_256 *)acts[i])
#define LOAD(p) _mm512_loadu_si512((const void *)(p))

// the 6-bit quants of registers R0..R3 (quants.h: R0 = X & 63, R1 = Y & 63, R2 = (Z ^ X >> 2) & 63,
// R3 = (Z >> 2 ^ Y >> 6) & 63)
INLINE void q6kp_unpack(const uint8_t planes[3][64], __m512i r[4]) {
    const __m512i X = LOAD(planes[0]), Y = LOAD(planes[1]), Z = LOAD(planes[2]);
    const __m512i m6 = _mm512_set1_epi8(63);
    r[0] = _mm512_and_si512(X, m6);
    r[1] = _mm512_and_si512(Y, m6);
    // 0x28: (a ^ b) & c
    r[2] = _mm512_ternarylogic_epi32(Z, _mm512_srli_epi16(X, 2), m6, 0x28);
    r[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(Z, 2), _mm512_srli_epi16(Y, 6), m6, 0x28);
}

// the float scales of a block: scale k times d in lane k
INLINE __m512 q6kp_scales(const block_q6_Kp *x) {
    const __m512i s = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)x->scales));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(_cvtsh_ss(x->d)));
}

// nr rows (row_bytes apart) . na activations: each activation's quants and block sums serve
// every row (from memory 2 rows do better than more, quants.h). The stored quants are offset by
// +32, taken out through the activation sums of each sub-block.
INLINE void q6_Kp_rows(int n, const uint8_t *w, size_t row_bytes, const int nr, const void *const *acts, const int na,
                       float *out) {
    __m512 acc[FM_DOTR_MAX][FM_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < nr; r++)
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) acc[r][i] = _mm512_setzero_ps();
    // the rows are read side by side, a span of nr rows at a time; the requests run ahead in one
    // line through the bytes after it, at the pace of the reads (nr blocks per step), a whole
    // number of spans and at least FM_PREFETCH_AHEAD bytes ahead, which reads faster than
    // requests ahead within each row (docs/performance.md)
    const size_t span = (size_t)nr * row_bytes, step = (size_t)nr * sizeof(block_q6_Kp);
    const uint8_t *ahead = w + (span ? (FM_PREFETCH_AHEAD + span - 1) / span * span : FM_PREFETCH_AHEAD);
    for (int b = 0; b < n / QK_K; b++, ahead += step) {
        _Pragma("GCC unroll 16")
        for (size_t off = 0; off < step; off += 64) __builtin_prefetch(ahead + off, 0, 3);
        __m512i q[FM_DOTR_MAX][4];
        __m512 scale[FM_DOTR_MAX];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < nr; r++) {
            const block_q6_Kp *x = (const block_q6_Kp *)(w + r * row_bytes) + b;
            q6kp_unpack(x->planes, q[r]);
            scale[r] = q6kp_scales(x);
        }
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            const block_a8_256 *y = ACT(i) + b;
            const __m512i off = _mm512_sub_epi32(_mm512_setzero_si512(),
                                                 _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)y->bsums)), 5));
            _Pragma("GCC unroll 4")
            for (int r = 0; r < nr; r++) {
                // one chain of four: the other (row, activation) pairs fill its latency, where two
                // chains cost an add more per pair, which a head of two or more rows is bound by
                const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(
                    off, q[r][0], LOAD(y->qs)), q[r][1], LOAD(y->qs + 64)), q[r][2], LOAD(y->qs + 128)), q[r][3], LOAD(y->qs + 192));
                acc[r][i] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), scale[r]), _mm512_set1_ps(y->d), acc[r][i]);
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++)
        _Pragma("GCC unroll 4")
        for (int r = 0; r < nr; r++) out[i * FM_DOTR_MAX + r] = _mm512_reduce_add_ps(acc[r][i]);
}

INLINE void q6_Kp_n(int n, const block_q6_Kp *x, const void *const *acts, const int na, float *out) {
    float y[FM_DOTN_MAX * FM_DOTR_MAX];
    q6_Kp_rows(n, (const uint8_t *)x, 0, 1, acts, na, y);
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = y[i * FM_DOTR_MAX];
}

float fm_dot_q6_Kp_a8_avx512(int n, const void *w, const void *a) {
    float out;
    q6_Kp_n(n, w, &a, 1, &out);
    return out;
}

FM_DEFINE_DOTN(fm_dotn_q6_Kp_a8_avx512, q6_Kp_n, block_q6_Kp)
FM_DEFINE_DOTR(fm_dotr_q6_Kp_a8_avx512, q6_Kp_rows)
