/* AVX-512 VNNI dot products of K-quant super-blocks (Q4_K, Q5_K, Q6_K) with 8-bit
 * activations: 64 quants per `vpdpbusd`, per-lane int32 scales, mins and the Q6_K offset
 * through the activation block sums. Built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni. */
#include <immintrin.h>
#include "quants.h"

static inline int hsum_i32(__m128i v) {
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1));
    return _mm_cvtsi128_si32(v);
}

static inline __m512i join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

static inline int mins_dot(const uint8_t *mins8, const int16_t *bsums) {
    __m128i b0 = _mm_loadu_si128((const __m128i *)bsums), b1 = _mm_loadu_si128((const __m128i *)(bsums + 8));
    __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mins8));
    return hsum_i32(_mm_madd_epi16(m, _mm_hadd_epi16(b0, b1)));
}

// int32 lanes 0..7 = sc[2j], lanes 8..15 = sc[2j+1]
static inline __m512i pair_scales(const uint8_t *sc, int j) {
    return join(_mm256_set1_epi32(sc[2 * j]), _mm256_set1_epi32(sc[2 * j + 1]));
}

#define DPBUSD(u, v) _mm512_dpbusd_epi32(_mm512_setzero_si512(), (u), _mm512_loadu_si512((const void *)(v)))

float fm_dot_q4_K_a8_avx512(int n, const void *w, const void *a) {
    const block_q4_K *x = w;
    const block_a8_256 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m512 acc = _mm512_setzero_ps();
    float summin = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        uint32_t sm[4];
        fm_unpack_scales_k4(x[b].scales, sm);
        const uint8_t *sc = (const uint8_t *)sm;
        __m512i si = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * j));
            __m512i u = join(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
            si = _mm512_add_epi32(si, _mm512_mullo_epi32(DPBUSD(u, y[b].qs + 64 * j), pair_scales(sc, j)));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(_cvtsh_ss(x[b].d) * y[b].d), acc);
        summin += _cvtsh_ss(x[b].dmin) * y[b].d * (float)mins_dot(sc + 8, y[b].bsums);
    }
    return _mm512_reduce_add_ps(acc) - summin;
}

float fm_dot_q5_K_a8_avx512(int n, const void *w, const void *a) {
    const block_q5_K *x = w;
    const block_a8_256 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF), bit4 = _mm256_set1_epi8(0x10);
    __m512 acc = _mm512_setzero_ps();
    float summin = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        uint32_t sm[4];
        fm_unpack_scales_k4(x[b].scales, sm);
        const uint8_t *sc = (const uint8_t *)sm;
        __m256i hb = _mm256_loadu_si256((const __m256i *)x[b].qh);
        __m512i si = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * j));
            __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                         _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
            si = _mm512_add_epi32(si, _mm512_mullo_epi32(DPBUSD(join(lo, hi), y[b].qs + 64 * j), pair_scales(sc, j)));
            hb = _mm256_srli_epi16(hb, 2);
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(_cvtsh_ss(x[b].d) * y[b].d), acc);
        summin += _cvtsh_ss(x[b].dmin) * y[b].d * (float)mins_dot(sc + 8, y[b].bsums);
    }
    return _mm512_reduce_add_ps(acc) - summin;
}

float fm_dot_q6_K_a8_avx512(int n, const void *w, const void *a) {
    const block_q6_K *x = w;
    const block_a8_256 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(0x30);
    // int32 lane i of a 64-quant step covers quants 4i..4i+3: group (4i)/16 within the step
    const __m128i rep4 = _mm_set_epi8(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *v = y[b].qs;
        __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        __m512i si = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, v += 128) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i hh = _mm256_loadu_si256((const __m256i *)qh);
            __m256i u0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hh, 4), m2));
            __m256i u1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hh, 2), m2));
            __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hh, m2));
            __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(hh, 2), m2));
            __m512i sc0 = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(s8, _mm_add_epi8(rep4, _mm_set1_epi8((char)(8 * h)))));
            __m512i sc1 = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(s8, _mm_add_epi8(rep4, _mm_set1_epi8((char)(8 * h + 4)))));
            si = _mm512_add_epi32(si, _mm512_mullo_epi32(DPBUSD(join(u0, u1), v), sc0));
            si = _mm512_add_epi32(si, _mm512_mullo_epi32(DPBUSD(join(u2, u3), v + 64), sc1));
        }
        // quants are stored +32: subtract 32 * sum_g scale[g] * bsum[g]
        __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(s8), _mm256_loadu_si256((const __m256i *)y[b].bsums));
        int c = hsum_i32(_mm_add_epi32(_mm256_castsi256_si128(corr), _mm256_extracti128_si256(corr, 1)));
        float d = _cvtsh_ss(x[b].d) * y[b].d;
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(d), acc);
        acc = _mm512_mask_sub_ps(acc, 1, acc, _mm512_set1_ps(d * (float)(32 * c)));
    }
    return _mm512_reduce_add_ps(acc);
}
