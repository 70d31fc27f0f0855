/* SSSE3 dot products of K-quant super-blocks (Q4_K, Q5_K, Q6_K) with 8-bit activations:
 * unsigned quants times signed activations by `pmaddubsw`, scales by `pmaddwd`, mins and the
 * Q6_K offset through the activation block sums. Built with -mssse3 only. */
#include <tmmintrin.h>
#include "quants.h"

static inline float hsum_ps(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
    return _mm_cvtss_f32(v);
}

static inline int hsum_i32(__m128i v) {
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1));
    return _mm_cvtsi128_si32(v);
}

#define LOAD(p) _mm_loadu_si128((const __m128i *)(p))

// sum_j mins[j] * (bsums[2j] + bsums[2j+1])
static inline int mins_dot(const uint8_t *mins8, const int16_t *bsums) {
    __m128i pairs = _mm_hadd_epi16(LOAD(bsums), LOAD(bsums + 8));
    __m128i m = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)mins8), _mm_setzero_si128());
    return hsum_i32(_mm_madd_epi16(m, pairs));
}

// 32 unsigned quants (two halves) . 32 activations, times one scale -> 4 int32
static inline __m128i dot32_scaled(__m128i u0, __m128i u1, const int8_t *v, int scale) {
    __m128i p = _mm_add_epi16(_mm_maddubs_epi16(u0, LOAD(v)), _mm_maddubs_epi16(u1, LOAD(v + 16)));
    return _mm_madd_epi16(p, _mm_set1_epi16((short)scale));
}

float fm_dot_q4_K_a8_ssse3(int n, const void *w, const void *a) {
    const block_q4_K *x = w;
    const block_a8_256 *y = a;
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m128 acc = _mm_setzero_ps();
    float summin = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        uint32_t sm[4];
        fm_unpack_scales_k4(x[b].scales, sm);
        const uint8_t *sc = (const uint8_t *)sm;
        const uint8_t *q = x[b].qs;
        const int8_t *v = y[b].qs;
        __m128i si = _mm_setzero_si128();
        for (int j = 0; j < 4; j++, q += 32, v += 64) {
            __m128i q0 = LOAD(q), q1 = LOAD(q + 16);
            si = _mm_add_epi32(si, dot32_scaled(_mm_and_si128(q0, m4), _mm_and_si128(q1, m4), v, sc[2 * j]));
            si = _mm_add_epi32(si, dot32_scaled(_mm_and_si128(_mm_srli_epi16(q0, 4), m4),
                                                _mm_and_si128(_mm_srli_epi16(q1, 4), m4), v + 32, sc[2 * j + 1]));
        }
        float d = fm_half(x[b].d) * y[b].d;
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(si), _mm_set1_ps(d)));
        summin += fm_half(x[b].dmin) * y[b].d * (float)mins_dot(sc + 8, y[b].bsums);
    }
    return hsum_ps(acc) - summin;
}

float fm_dot_q5_K_a8_ssse3(int n, const void *w, const void *a) {
    const block_q5_K *x = w;
    const block_a8_256 *y = a;
    const __m128i m4 = _mm_set1_epi8(0xF), bit4 = _mm_set1_epi8(0x10);
    __m128 acc = _mm_setzero_ps();
    float summin = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        uint32_t sm[4];
        fm_unpack_scales_k4(x[b].scales, sm);
        const uint8_t *sc = (const uint8_t *)sm;
        const uint8_t *q = x[b].qs;
        const int8_t *v = y[b].qs;
        __m128i h0 = LOAD(x[b].qh), h1 = LOAD(x[b].qh + 16);
        __m128i si = _mm_setzero_si128();
        for (int j = 0; j < 4; j++, q += 32, v += 64) {
            __m128i q0 = LOAD(q), q1 = LOAD(q + 16);
            // bit 2j of qh -> bit 4 of the low quant; bit 2j+1 -> bit 4 of the high quant
            __m128i lo0 = _mm_or_si128(_mm_and_si128(q0, m4), _mm_and_si128(_mm_slli_epi16(h0, 4), bit4));
            __m128i lo1 = _mm_or_si128(_mm_and_si128(q1, m4), _mm_and_si128(_mm_slli_epi16(h1, 4), bit4));
            __m128i hi0 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q0, 4), m4),
                                       _mm_and_si128(_mm_slli_epi16(h0, 3), bit4));
            __m128i hi1 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q1, 4), m4),
                                       _mm_and_si128(_mm_slli_epi16(h1, 3), bit4));
            si = _mm_add_epi32(si, dot32_scaled(lo0, lo1, v, sc[2 * j]));
            si = _mm_add_epi32(si, dot32_scaled(hi0, hi1, v + 32, sc[2 * j + 1]));
            h0 = _mm_srli_epi16(h0, 2);
            h1 = _mm_srli_epi16(h1, 2);
        }
        float d = fm_half(x[b].d) * y[b].d;
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(si), _mm_set1_ps(d)));
        summin += fm_half(x[b].dmin) * y[b].d * (float)mins_dot(sc + 8, y[b].bsums);
    }
    return hsum_ps(acc) - summin;
}

// 16 unsigned 6-bit quants . 16 activations, times one signed scale -> 4 int32
static inline __m128i dot16_scaled(__m128i u, const int8_t *v, int scale) {
    return _mm_madd_epi16(_mm_maddubs_epi16(u, LOAD(v)), _mm_set1_epi16((short)scale));
}

float fm_dot_q6_K_a8_ssse3(int n, const void *w, const void *a) {
    const block_q6_K *x = w;
    const block_a8_256 *y = a;
    const __m128i m4 = _mm_set1_epi8(0xF), m2 = _mm_set1_epi8(0x30);
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *sc = x[b].scales, *v = y[b].qs;
        __m128i si = _mm_setzero_si128();
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, v += 128) {
            __m128i l0 = LOAD(ql), l1 = LOAD(ql + 16), l2 = LOAD(ql + 32), l3 = LOAD(ql + 48);
            __m128i h0 = LOAD(qh), h1 = LOAD(qh + 16);
            __m128i u[8] = {
                _mm_or_si128(_mm_and_si128(l0, m4), _mm_and_si128(_mm_slli_epi16(h0, 4), m2)),
                _mm_or_si128(_mm_and_si128(l1, m4), _mm_and_si128(_mm_slli_epi16(h1, 4), m2)),
                _mm_or_si128(_mm_and_si128(l2, m4), _mm_and_si128(_mm_slli_epi16(h0, 2), m2)),
                _mm_or_si128(_mm_and_si128(l3, m4), _mm_and_si128(_mm_slli_epi16(h1, 2), m2)),
                _mm_or_si128(_mm_and_si128(_mm_srli_epi16(l0, 4), m4), _mm_and_si128(h0, m2)),
                _mm_or_si128(_mm_and_si128(_mm_srli_epi16(l1, 4), m4), _mm_and_si128(h1, m2)),
                _mm_or_si128(_mm_and_si128(_mm_srli_epi16(l2, 4), m4), _mm_and_si128(_mm_srli_epi16(h0, 2), m2)),
                _mm_or_si128(_mm_and_si128(_mm_srli_epi16(l3, 4), m4), _mm_and_si128(_mm_srli_epi16(h1, 2), m2)),
            };
            for (int g = 0; g < 8; g++) si = _mm_add_epi32(si, dot16_scaled(u[g], v + 16 * g, sc[g]));
        }
        // the stored quants are offset by +32: subtract 32 * sum_g scale[g] * bsum[g]
        __m128i s8 = LOAD(x[b].scales);
        __m128i slo = _mm_srai_epi16(_mm_unpacklo_epi8(s8, s8), 8), shi = _mm_srai_epi16(_mm_unpackhi_epi8(s8, s8), 8);
        __m128i corr = _mm_add_epi32(_mm_madd_epi16(slo, LOAD(y[b].bsums)), _mm_madd_epi16(shi, LOAD(y[b].bsums + 8)));
        si = _mm_sub_epi32(si, _mm_slli_epi32(corr, 5));
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(si), _mm_set1_ps(fm_half(x[b].d) * y[b].d)));
    }
    return hsum_ps(acc);
}
