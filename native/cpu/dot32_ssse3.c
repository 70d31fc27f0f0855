/* SSSE3 dot products of 32-value blocks (Q4_0, Q8_0) with 8-bit activations: `pmaddubsw`
 * on |w| and sign(w)*a. Built with -mssse3 only; must hold no AVX instruction. */
#include <tmmintrin.h>
#include "quants.h"

static inline float hsum_ps(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
    return _mm_cvtss_f32(v);
}

// 16 signed bytes w . 16 signed bytes a -> 4 int32 partial sums
static inline __m128i dot_i8(__m128i w, __m128i a) {
    __m128i p = _mm_maddubs_epi16(_mm_sign_epi8(w, w), _mm_sign_epi8(a, w));
    return _mm_madd_epi16(p, _mm_set1_epi16(1));
}

float fm_dot_q4_0_a8_ssse3(int n, const void *w, const void *a) {
    const block_q4_0 *x = w;
    const block_a8_32 *y = a;
    const __m128i m4 = _mm_set1_epi8(0xF), off = _mm_set1_epi8(8);
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < n / QK32; b++) {
        __m128i q = _mm_loadu_si128((const __m128i *)x[b].qs);
        __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m4), off);
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), off);
        __m128i s = _mm_add_epi32(dot_i8(lo, _mm_loadu_si128((const __m128i *)y[b].qs)),
                                  dot_i8(hi, _mm_loadu_si128((const __m128i *)(y[b].qs + 16))));
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(s), _mm_set1_ps(fm_half(x[b].d) * y[b].d)));
    }
    return hsum_ps(acc);
}

float fm_dot_q8_0_a8_ssse3(int n, const void *w, const void *a) {
    const block_q8_0 *x = w;
    const block_a8_32 *y = a;
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < n / QK32; b++) {
        __m128i s = _mm_add_epi32(
            dot_i8(_mm_loadu_si128((const __m128i *)x[b].qs), _mm_loadu_si128((const __m128i *)y[b].qs)),
            dot_i8(_mm_loadu_si128((const __m128i *)(x[b].qs + 16)),
                   _mm_loadu_si128((const __m128i *)(y[b].qs + 16))));
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(s), _mm_set1_ps(fm_half(x[b].d) * y[b].d)));
    }
    return hsum_ps(acc);
}
