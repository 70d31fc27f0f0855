/* AVX2 dot products of K-quant super-blocks (Q4_K, Q5_K, Q6_K) with 8-bit activations.
 * Same arithmetic as the SSSE3 sibling on 256-bit registers. Built with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include "quants.h"

static inline float hsum256_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline int hsum_i32(__m128i v) {
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1));
    return _mm_cvtsi128_si32(v);
}

#define LOAD(p) _mm256_loadu_si256((const __m256i *)(p))

static inline int mins_dot(const uint8_t *mins8, const int16_t *bsums) {
    __m128i b0 = _mm_loadu_si128((const __m128i *)bsums), b1 = _mm_loadu_si128((const __m128i *)(bsums + 8));
    __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mins8));
    return hsum_i32(_mm_madd_epi16(m, _mm_hadd_epi16(b0, b1)));
}

// 32 unsigned quants . 32 activations, times a per-128-bit-lane int16 scale -> 8 int32
static inline __m256i dot32_scaled(__m256i u, const int8_t *v, __m256i scale) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, LOAD(v)), scale);
}

float fm_dot_q4_K_a8_avx2(int n, const void *w, const void *a) {
    const block_q4_K *x = w;
    const block_a8_256 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    float summin = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        uint32_t sm[4];
        fm_unpack_scales_k4(x[b].scales, sm);
        const uint8_t *sc = (const uint8_t *)sm;
        const uint8_t *q = x[b].qs;
        const int8_t *v = y[b].qs;
        __m256i si = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, q += 32, v += 64) {
            __m256i qq = LOAD(q);
            si = _mm256_add_epi32(si, dot32_scaled(_mm256_and_si256(qq, m4), v, _mm256_set1_epi16(sc[2 * j])));
            si = _mm256_add_epi32(si, dot32_scaled(_mm256_and_si256(_mm256_srli_epi16(qq, 4), m4), v + 32,
                                                   _mm256_set1_epi16(sc[2 * j + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(_cvtsh_ss(x[b].d) * y[b].d), acc);
        summin += _cvtsh_ss(x[b].dmin) * y[b].d * (float)mins_dot(sc + 8, y[b].bsums);
    }
    return hsum256_ps(acc) - summin;
}

float fm_dot_q5_K_a8_avx2(int n, const void *w, const void *a) {
    const block_q5_K *x = w;
    const block_a8_256 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF), bit4 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    float summin = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        uint32_t sm[4];
        fm_unpack_scales_k4(x[b].scales, sm);
        const uint8_t *sc = (const uint8_t *)sm;
        const uint8_t *q = x[b].qs;
        const int8_t *v = y[b].qs;
        __m256i hb = LOAD(x[b].qh);
        __m256i si = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, q += 32, v += 64) {
            __m256i qq = LOAD(q);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(qq, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qq, 4), m4),
                                         _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
            si = _mm256_add_epi32(si, dot32_scaled(lo, v, _mm256_set1_epi16(sc[2 * j])));
            si = _mm256_add_epi32(si, dot32_scaled(hi, v + 32, _mm256_set1_epi16(sc[2 * j + 1])));
            hb = _mm256_srli_epi16(hb, 2);
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(_cvtsh_ss(x[b].d) * y[b].d), acc);
        summin += _cvtsh_ss(x[b].dmin) * y[b].d * (float)mins_dot(sc + 8, y[b].bsums);
    }
    return hsum256_ps(acc) - summin;
}

// int16 scale vector: sc[g] in the low 128-bit lane, sc[g+1] in the high one
static inline __m256i pair_scale(const int8_t *sc, int g) {
    return _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
}

float fm_dot_q6_K_a8_avx2(int n, const void *w, const void *a) {
    const block_q6_K *x = w;
    const block_a8_256 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *sc = x[b].scales, *v = y[b].qs;
        __m256i si = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, v += 128) {
            __m256i l0 = LOAD(ql), l1 = LOAD(ql + 32), hh = LOAD(qh);
            __m256i u0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hh, 4), m2));
            __m256i u1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hh, 2), m2));
            __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hh, m2));
            __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(hh, 2), m2));
            si = _mm256_add_epi32(si, dot32_scaled(u0, v, pair_scale(sc, 0)));
            si = _mm256_add_epi32(si, dot32_scaled(u1, v + 32, pair_scale(sc, 2)));
            si = _mm256_add_epi32(si, dot32_scaled(u2, v + 64, pair_scale(sc, 4)));
            si = _mm256_add_epi32(si, dot32_scaled(u3, v + 96, pair_scale(sc, 6)));
        }
        // quants are stored +32: subtract 32 * sum_g scale[g] * bsum[g]
        __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[b].scales));
        si = _mm256_sub_epi32(si, _mm256_slli_epi32(_mm256_madd_epi16(s16, LOAD(y[b].bsums)), 5));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(_cvtsh_ss(x[b].d) * y[b].d), acc);
    }
    return hsum256_ps(acc);
}
