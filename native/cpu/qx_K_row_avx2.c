/* AVX2 dot products of K-quant super-blocks (Q4_K, Q5_K, Q6_K) with 8-bit activations.
 * Same arithmetic as the SSSE3 sibling on 256-bit registers. Built with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include "quants.h"
#include "simd256.h"

#define LOAD(p) _mm256_loadu_si256((const __m256i *)(p))

float fm_dot_q4_K_a8_avx2(int n, const void *w, const void *a) {
    const block_q4_K *x = w;
    const block_a8_256 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m128i md;
        const __m256i sc = _mm256_broadcastsi128_si256(k4_scales16(x[b].scales, y[b].sums32, &md));
        const uint8_t *q = x[b].qs;
        const int8_t *v = y[b].qs;
        __m256i si = _mm256_setzero_si256();
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++, q += 32, v += 64) {
            const __m256i qq = LOAD(q);
            si = _mm256_add_epi32(si, dot32_scaled(_mm256_and_si256(qq, m4), v, pick(sc, 2 * j)));
            si = _mm256_add_epi32(si, dot32_scaled(_mm256_and_si256(_mm256_srli_epi16(qq, 4), m4), v + 32, pick(sc, 2 * j + 1)));
        }
        const float dy = y[b].d;
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(_cvtsh_ss(x[b].d) * dy), acc);
        accm = _mm_fmadd_ps(_mm_cvtepi32_ps(md), _mm_set1_ps(_cvtsh_ss(x[b].dmin) * dy), accm);
    }
    return hsum256_ps(acc) - hsum128_ps(accm);
}

float fm_dot_q5_K_a8_avx2(int n, const void *w, const void *a) {
    const block_q5_K *x = w;
    const block_a8_256 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF), bit4 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m128i md;
        const __m256i sc = _mm256_broadcastsi128_si256(k4_scales16(x[b].scales, y[b].sums32, &md));
        const uint8_t *q = x[b].qs;
        const int8_t *v = y[b].qs;
        __m256i hb = LOAD(x[b].qh);
        __m256i si = _mm256_setzero_si256();
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++, q += 32, v += 64) {
            const __m256i qq = LOAD(q);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(qq, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qq, 4), m4),
                                               _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
            si = _mm256_add_epi32(si, dot32_scaled(lo, v, pick(sc, 2 * j)));
            si = _mm256_add_epi32(si, dot32_scaled(hi, v + 32, pick(sc, 2 * j + 1)));
            hb = _mm256_srli_epi16(hb, 2);
        }
        const float dy = y[b].d;
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(_cvtsh_ss(x[b].d) * dy), acc);
        accm = _mm_fmadd_ps(_mm_cvtepi32_ps(md), _mm_set1_ps(_cvtsh_ss(x[b].dmin) * dy), accm);
    }
    return hsum256_ps(acc) - hsum128_ps(accm);
}

float fm_dot_q6_K_a8_avx2(int n, const void *w, const void *a) {
    const block_q6_K *x = w;
    const block_a8_256 *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *v = y[b].qs;
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        __m256i si = q6_offset(s8, y[b].bsums);
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, v += 128) {
            const __m256i sc = q6_half_scales(s8, h);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++)
                si = _mm256_add_epi32(si, dot32_scaled(q6_group(ql, qh, g), v + 32 * g, pick(sc, 8 + g)));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(_cvtsh_ss(x[b].d) * y[b].d), acc);
    }
    return hsum256_ps(acc);
}
