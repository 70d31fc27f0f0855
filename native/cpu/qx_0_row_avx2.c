/* AVX2 dot products of 32-value blocks (Q4_0, Q8_0) with 8-bit activations: one block per
 * 256-bit `vpmaddubsw`; block scales of eight blocks converted at once (F16C) and applied by
 * FMA. Built with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include "quants.h"
#include "simd256.h"


// 16 bytes of nibbles (low halves then high halves, unsigned) . 32 activations -> 8 float
static inline __m256 dot_u4(const uint8_t *qs, const int8_t *a) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    const __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0xF));
    const __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)a));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

// 32 signed weights . 32 activations -> 8 float
static inline __m256 dot_i8(const int8_t *w, const int8_t *a) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)w);
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x),
                                           _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)a), x));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

// sum_b dw*dy*sum(u*q) - 8 * sum_b dw*(dy*sum(q)): the stored nibbles are offset by 8.
// Scales of up to 64 blocks are multiplied out first, so the block loop only broadcasts them;
// four accumulators keep the FMA latency off the critical path.
float fm_dot_q4_0_a8_avx2(int n, const void *w, const void *a) {
    const block_q4_0 *x = w;
    const int nb = n / QK32;
    const int8_t *q = a;
    const float *dy = fm_a32_d(a, nb), *sy = fm_a32_s(a, nb);
    const __m256i shift = _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0), m4 = _mm256_set1_epi8(0xF);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0, off = acc0;
    float dd[64] __attribute__((aligned(32)));
    int b = 0;
    for (; b + 8 <= nb;) {
        const int chunk = nb - b >= 64 ? 64 : (nb - b) & ~7;
        for (int k = 0; k < chunk; k += 8) {
            const __m256 dw = scales8((const uint8_t *)&x[b + k].d, sizeof(block_q4_0));
            _mm256_store_ps(dd + k, _mm256_mul_ps(dw, _mm256_loadu_ps(dy + b + k)));
            off = _mm256_fmadd_ps(dw, _mm256_loadu_ps(sy + b + k), off);
        }
        for (int k = 0; k < chunk; k += 4, b += 4) {
            fm_prefetch_ahead(x + b, 4 * sizeof *x);
#define BLOCK(j, acc) do { \
            const __m256i u = _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256( \
                _mm_loadu_si128((const __m128i *)x[b + j].qs)), shift), m4); \
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(q + QK32 * (b + j)))), ones); \
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(dd + k + j), acc); } while (0)
            BLOCK(0, acc0); BLOCK(1, acc1); BLOCK(2, acc2); BLOCK(3, acc3);
#undef BLOCK
        }
    }
    float sum = hsum256_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3))) - 8.0f * hsum256_ps(off);
    for (; b < nb; b++) {
        const float dw = _cvtsh_ss(x[b].d);
        sum += dw * (dy[b] * hsum256_ps(dot_u4(x[b].qs, q + QK32 * b)) - 8.0f * sy[b]);
    }
    return sum;
}

float fm_dot_q8_0_a8_avx2(int n, const void *w, const void *a) {
    const block_q8_0 *x = w;
    const int nb = n / QK32;
    const int8_t *q = a;
    const float *dy = fm_a32_d(a, nb);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        fm_prefetch_ahead(x + b, 8 * sizeof *x);
        float dd[8];
        _mm256_storeu_ps(dd, _mm256_mul_ps(scales8((const uint8_t *)&x[b].d, sizeof(block_q8_0)), _mm256_loadu_ps(dy + b)));
#pragma GCC unroll 4
        for (int k = 0; k < 8; k += 2) {
            acc0 = _mm256_fmadd_ps(dot_i8(x[b + k].qs, q + QK32 * (b + k)), _mm256_broadcast_ss(dd + k), acc0);
            acc1 = _mm256_fmadd_ps(dot_i8(x[b + k + 1].qs, q + QK32 * (b + k + 1)), _mm256_broadcast_ss(dd + k + 1), acc1);
        }
    }
    float sum = hsum256_ps(_mm256_add_ps(acc0, acc1));
    for (; b < nb; b++) sum += _cvtsh_ss(x[b].d) * dy[b] * hsum256_ps(dot_i8(x[b].qs, q + QK32 * b));
    return sum;
}
