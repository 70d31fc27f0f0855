/* AVX-512 VNNI dot products of 32-value blocks (Q4_0, Q8_0) with 8-bit activations: two
 * blocks per 512-bit `vpdpbusd`, the weights made unsigned by an offset that is taken back out
 * with a second `vpdpbusd`. Built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni. */
#include <immintrin.h>
#include "quants.h"

// two activation blocks (36 bytes apart) as one 64-byte vector
static inline __m512i load_a2(const block_a8_32 *y) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)y[0].qs)),
                              _mm256_loadu_si256((const __m256i *)y[1].qs), 1);
}

// 8 lanes of s0 then 8 lanes of s1
static inline __m512 scales2(float s0, float s1) {
    __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(s0)));
    return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_set1_ps(s1)), 1));
}

// u (unsigned, = w + off) . a, with off * sum(a) taken back out -> 16 int32
static inline __m512i dot_off(__m512i u, __m512i a, __m512i off) {
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, a),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, a));
}

static inline __m256i dot_off256(__m256i u, __m256i a, __m256i off) {
    return _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a),
                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), off, a));
}

static inline __m256i nibbles(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0xF));
}

float fm_dot_q4_0_a8_avx512(int n, const void *w, const void *a) {
    const block_q4_0 *x = w;
    const block_a8_32 *y = a;
    const int nb = n / QK32;
    __m512 acc = _mm512_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(nibbles(x[b].qs)), nibbles(x[b + 1].qs), 1);
        __m512i s = dot_off(u, load_a2(y + b), _mm512_set1_epi8(8));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                              scales2(_cvtsh_ss(x[b].d) * y[b].d, _cvtsh_ss(x[b + 1].d) * y[b + 1].d), acc);
    }
    float sum = _mm512_reduce_add_ps(acc);
    if (b < nb) {
        __m256i s = dot_off256(nibbles(x[b].qs), _mm256_loadu_si256((const __m256i *)y[b].qs), _mm256_set1_epi8(8));
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        sum += _cvtsh_ss(x[b].d) * y[b].d * (float)_mm_cvtsi128_si32(t);
    }
    return sum;
}

float fm_dot_q8_0_a8_avx512(int n, const void *w, const void *a) {
    const block_q8_0 *x = w;
    const block_a8_32 *y = a;
    const int nb = n / QK32;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc = _mm512_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)x[b].qs)),
                                       _mm256_loadu_si256((const __m256i *)x[b + 1].qs), 1);
        __m512i s = dot_off(_mm512_xor_si512(q, flip), load_a2(y + b), flip);  // w + 128 as unsigned
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                              scales2(_cvtsh_ss(x[b].d) * y[b].d, _cvtsh_ss(x[b + 1].d) * y[b + 1].d), acc);
    }
    float sum = _mm512_reduce_add_ps(acc);
    if (b < nb) {
        const __m256i flip8 = _mm256_set1_epi8((char)0x80);
        __m256i q = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256i s = dot_off256(_mm256_xor_si256(q, flip8), _mm256_loadu_si256((const __m256i *)y[b].qs), flip8);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        sum += _cvtsh_ss(x[b].d) * y[b].d * (float)_mm_cvtsi128_si32(t);
    }
    return sum;
}
