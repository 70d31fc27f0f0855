/* AVX2 dot products of 32-value blocks (Q4_0, Q8_0) with 8-bit activations: one block per
 * 256-bit `vpmaddubsw`, FMA into a float accumulator. Built with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include "quants.h"

static inline float hsum256_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

// 32 signed bytes w . 32 signed bytes a -> 8 float partial sums
static inline __m256 dot_i8(__m256i w, __m256i a) {
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

float fm_dot_q4_0_a8_avx2(int n, const void *w, const void *a) {
    const block_q4_0 *x = w;
    const block_a8_32 *y = a;
    const __m256i m4 = _mm256_set1_epi8(0xF), off = _mm256_set1_epi8(8);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / QK32; b++) {
        __m128i q = _mm_loadu_si128((const __m128i *)x[b].qs);
        __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
        __m256 s = dot_i8(_mm256_sub_epi8(u, off), _mm256_loadu_si256((const __m256i *)y[b].qs));
        acc = _mm256_fmadd_ps(s, _mm256_set1_ps(_cvtsh_ss(x[b].d) * y[b].d), acc);
    }
    return hsum256_ps(acc);
}

float fm_dot_q8_0_a8_avx2(int n, const void *w, const void *a) {
    const block_q8_0 *x = w;
    const block_a8_32 *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / QK32; b++) {
        __m256 s = dot_i8(_mm256_loadu_si256((const __m256i *)x[b].qs),
                          _mm256_loadu_si256((const __m256i *)y[b].qs));
        acc = _mm256_fmadd_ps(s, _mm256_set1_ps(_cvtsh_ss(x[b].d) * y[b].d), acc);
    }
    return hsum256_ps(acc);
}
