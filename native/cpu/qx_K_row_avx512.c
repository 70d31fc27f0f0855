/* AVX-512 VNNI dot products of K-quant super-blocks (Q4_K, Q5_K, Q6_K) with 8-bit
 * activations: 64 quants per `vpmaddubsw`, their sub-block scales applied and accumulated by
 * one `vpdpwssd`; mins and the Q6_K offset through the activation block sums.
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni. */
#include <immintrin.h>
#include "quants.h"
#include "simd256.h"
#include "simd512.h"

float fm_dot_q4_K_a8_avx512(int n, const void *w, const void *a) {
    const block_q4_K *x = w;
    const block_a8_256 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m128i md;
        const __m512i sc = _mm512_broadcast_i32x4(k4_scales16(x[b].scales, y[b].sums32, &md));
        __m512i si = _mm512_setzero_si512();
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * j));
            const __m512i u = join(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
            si = step512(si, u, y[b].qs + 64 * j, pick512(sc, j));
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
        fm_prefetch_ahead(x + b, sizeof *x);
        __m128i md;
        const __m512i sc = _mm512_broadcast_i32x4(k4_scales16(x[b].scales, y[b].sums32, &md));
        __m256i hb = _mm256_loadu_si256((const __m256i *)x[b].qh);
        __m512i si = _mm512_setzero_si512();
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * j));
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                               _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
            si = step512(si, join(lo, hi), y[b].qs + 64 * j, pick512(sc, j));
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
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *v = y[b].qs;
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        __m512i si = _mm512_zextsi256_si512(q6_offset(s8, y[b].bsums));
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, v += 128) {
            const __m512i sc = _mm512_broadcast_i32x4(_mm_cvtepi8_epi16(h ? _mm_srli_si128(s8, 8) : s8));
            si = step512(si, q6_quants(ql, qh, 0), v, pick512(sc, 4));
            si = step512(si, q6_quants(ql, qh, 1), v + 64, pick512(sc, 5));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(_cvtsh_ss(x[b].d) * y[b].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}
