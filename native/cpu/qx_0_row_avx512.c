/* AVX-512 VNNI dot products of 32-value blocks (Q4_0, Q8_0) with 8-bit activations: two
 * blocks per 512-bit `vpdpbusd` on unsigned weights (Q4_0 nibbles; Q8_0 offset by 128), the
 * offsets taken out through the activation sums. Built with -mavx512f -mavx512bw
 * -mavx512vl -mavx512vnni. */
#include <immintrin.h>
#include "quants.h"
#include "simd256.h"
#include "simd512.h"

static inline float dot256(__m256i u, const int8_t *a) {
    return hsum256_ps(_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u,
                                                             _mm256_loadu_si256((const __m256i *)a))));
}

// sum_b dw*dy*sum(u*q) - off * sum_b dw*(dy*sum(q)), u = w + off as unsigned bytes
#define DOT32_AVX512(name, block_t, unsigned2, unsigned1, offset)                                              \
    float name(int n, const void *w, const void *a) {                                                          \
        const block_t *x = w;                                                                                  \
        const int nb = n / QK32;                                                                               \
        const int8_t *q = a;                                                                                   \
        const float *dy = fm_a32_d(a, nb), *sy = fm_a32_s(a, nb);                                              \
        __m512 acc = _mm512_setzero_ps();                                                                      \
        __m256 off = _mm256_setzero_ps();                                                                      \
        int b = 0;                                                                                             \
        for (; b + 8 <= nb; b += 8) {                                                                          \
            fm_prefetch_ahead(x + b, 8 * sizeof *x);                                                           \
            const __m256 dw = scales8((const uint8_t *)&x[b].d, sizeof(block_t));                              \
            const __m512 dd = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_loadu_ps(dy + b)));              \
            off = _mm256_fmadd_ps(dw, _mm256_loadu_ps(sy + b), off);                                           \
            _Pragma("GCC unroll 4")                                                                            \
            for (int k = 0; k < 8; k += 2) {                                                                   \
                const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), unsigned2(x + b + k),            \
                                                      _mm512_loadu_si512((const void *)(q + QK32 * (b + k)))); \
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), lane_pair(dd, k), acc);                           \
            }                                                                                                  \
        }                                                                                                      \
        float sum = _mm512_reduce_add_ps(acc) - (offset) * hsum256_ps(off);                                    \
        for (; b < nb; b++) {                                                                                  \
            const float dw = _cvtsh_ss(x[b].d);                                                                \
            sum += dw * (dy[b] * dot256(unsigned1(x + b), q + QK32 * b) - (offset) * sy[b]);                   \
        }                                                                                                      \
        return sum;                                                                                            \
    }

static inline __m256i q4_u1(const block_q4_0 *x) { return q4_nibbles(x->qs); }
static inline __m512i q4_u2(const block_q4_0 *x) { return join(q4_nibbles(x[0].qs), q4_nibbles(x[1].qs)); }
static inline __m256i q8_u1(const block_q8_0 *x) {
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)x->qs), _mm256_set1_epi8((char)0x80));
}
static inline __m512i q8_u2(const block_q8_0 *x) { return join(q8_u1(x), q8_u1(x + 1)); }

DOT32_AVX512(fm_dot_q4_0_a8_avx512, block_q4_0, q4_u2, q4_u1, 8.0f)
DOT32_AVX512(fm_dot_q8_0_a8_avx512, block_q8_0, q8_u2, q8_u1, 128.0f)
