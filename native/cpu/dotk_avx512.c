/* AVX-512 VNNI dot products of K-quant super-blocks (Q4_K, Q5_K, Q6_K) with 8-bit
 * activations: 64 quants per `vpmaddubsw`, their sub-block scales applied and accumulated by
 * one `vpdpwssd`; mins and the Q6_K offset through the activation block sums.
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni. */
#include <immintrin.h>
#include "quants.h"

static inline float hsum128_ps(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
    return _mm_cvtss_f32(v);
}

static inline __m512i join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// pshufb patterns over 8 x int16 scales repeated in each 128-bit lane. Row k picks, in the
// four lanes, scales a, a, b, b with (a, b) = (2k, 2k+1) for rows 0..3 (Q4_K/Q5_K steps of
// 64 quants: two sub-blocks of 32); rows 4 and 5 pick 0, 1, 2, 3 and 4, 5, 6, 7 (Q6_K: one
// scale per 16 quants).
#define W(s) 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1, \
             2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1
static const uint8_t PATTERNS[6][64] __attribute__((aligned(64))) = {
    { W(0), W(0), W(1), W(1) }, { W(2), W(2), W(3), W(3) }, { W(4), W(4), W(5), W(5) },
    { W(6), W(6), W(7), W(7) }, { W(0), W(1), W(2), W(3) }, { W(4), W(5), W(6), W(7) },
};
#undef W

static inline __m512i pick(__m512i sc, int row) {
    return _mm512_shuffle_epi8(sc, _mm512_load_si512((const void *)PATTERNS[row]));
}

// si += scale . (u . a): 64 unsigned quants, 64 activations
static inline __m512i step(__m512i si, __m512i u, const int8_t *a, __m512i scale) {
    return _mm512_dpwssd_epi32(si, _mm512_maddubs_epi16(u, _mm512_loadu_si512((const void *)a)), scale);
}

// scales as int16 in every 128-bit lane; mins . pair sums of bsums as 4 int32
static inline __m512i k4_scales(const uint8_t *packed, const int16_t *bsums, __m128i *mins_dot) {
    uint32_t sm[4];
    fm_unpack_scales_k4(packed, sm);
    const __m128i v = _mm_loadu_si128((const __m128i *)sm);
    const __m128i b0 = _mm_loadu_si128((const __m128i *)bsums), b1 = _mm_loadu_si128((const __m128i *)(bsums + 8));
    *mins_dot = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(v, 8)), _mm_hadd_epi16(b0, b1));
    return _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(v));
}

float fm_dot_q4_K_a8_avx512(int n, const void *w, const void *a) {
    const block_q4_K *x = w;
    const block_a8_256 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        __m128i md;
        const __m512i sc = k4_scales(x[b].scales, y[b].bsums, &md);
        __m512i si = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * j));
            const __m512i u = join(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
            si = step(si, u, y[b].qs + 64 * j, pick(sc, j));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(_cvtsh_ss(x[b].d) * y[b].d), acc);
        accm = _mm_fmadd_ps(_mm_cvtepi32_ps(md), _mm_set1_ps(_cvtsh_ss(x[b].dmin) * y[b].d), accm);
    }
    return _mm512_reduce_add_ps(acc) - hsum128_ps(accm);
}

float fm_dot_q5_K_a8_avx512(int n, const void *w, const void *a) {
    const block_q5_K *x = w;
    const block_a8_256 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF), bit4 = _mm256_set1_epi8(0x10);
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        __m128i md;
        const __m512i sc = k4_scales(x[b].scales, y[b].bsums, &md);
        __m256i hb = _mm256_loadu_si256((const __m256i *)x[b].qh);
        __m512i si = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * j));
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                               _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
            si = step(si, join(lo, hi), y[b].qs + 64 * j, pick(sc, j));
            hb = _mm256_srli_epi16(hb, 2);
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(_cvtsh_ss(x[b].d) * y[b].d), acc);
        accm = _mm_fmadd_ps(_mm_cvtepi32_ps(md), _mm_set1_ps(_cvtsh_ss(x[b].dmin) * y[b].d), accm);
    }
    return _mm512_reduce_add_ps(acc) - hsum128_ps(accm);
}

float fm_dot_q6_K_a8_avx512(int n, const void *w, const void *a) {
    const block_q6_K *x = w;
    const block_a8_256 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(0x30);
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *v = y[b].qs;
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        // the stored quants are offset by +32: start from -32 * sum_g scale[g] * bsum[g]
        const __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(s8), _mm256_loadu_si256((const __m256i *)y[b].bsums));
        __m512i si = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(_mm256_slli_epi32(corr, 5)));
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, v += 128) {
            const __m512i sc = _mm512_broadcast_i32x4(_mm_cvtepi8_epi16(h ? _mm_srli_si128(s8, 8) : s8));
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i hh = _mm256_loadu_si256((const __m256i *)qh);
            const __m256i u0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hh, 4), m2));
            const __m256i u1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hh, 2), m2));
            const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hh, m2));
            const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(hh, 2), m2));
            si = step(si, join(u0, u1), v, pick(sc, 4));
            si = step(si, join(u2, u3), v + 64, pick(sc, 5));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(_cvtsh_ss(x[b].d) * y[b].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}
