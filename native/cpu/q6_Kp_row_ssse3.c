/* SSSE3 dot product of a Q6_Kp row (Q6_K repacked, quants.h) with 8-bit activations in the
 * same order: per 16-byte lane q of the four registers (64 values, sub-blocks 4q..4q+3), 9
 * operations unpack the quants, and the four registers' products, offset by the activations'
 * corrections, go through one `pmaddwd` with the lane's scale vector, one unpack of the scales
 * away. The corrections stand for the -32 * scale * sum that a `pmaddwd` of the block sums took
 * per block, and halve the `pmaddwd` of the quants. A block takes 88 vector operations, and on
 * a fast core these, not the memory or the front end, set the pace (docs/performance.md).
 * Built with -mssse3 only; must hold no AVX instruction. */
#include <tmmintrin.h>
#include "quants.h"
#include "simd128.h"

#define LOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define ALOAD(p) _mm_load_si128((const __m128i *)(p))   // activation quants and sums: 16-byte aligned (quants.h)

float fm_dot_q6_Kp_a8_ssse3(int n, const void *w, const void *a) {
    const block_q6_Kp *x = w;
    const block_a8_256 *y = a;
    const int16_t *corr = fm_q6kp_offsets(a, n / QK_K);
    const __m128i m6 = _mm_set1_epi8(63);
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++, corr += 32) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m128i s16[2];
        q6_scales16(x[b].scales, s16);
        __m128i si = _mm_setzero_si128();
        _Pragma("GCC unroll 4")
        for (int q = 0; q < 4; q++) {   // lane q: 32-bit lane m holds sub-block 4q + m
            const uint8_t *pl = x[b].planes[0] + 16 * q;
            const int8_t *v = y[b].qs + 16 * q;   // registers R0..R3 64 bytes apart
            const __m128i X = LOAD(pl), Y = LOAD(pl + 64), Z = LOAD(pl + 128);
            const __m128i R0 = _mm_and_si128(X, m6), R1 = _mm_and_si128(Y, m6);
            const __m128i R2 = _mm_and_si128(_mm_xor_si128(Z, _mm_srli_epi16(X, 2)), m6);
            const __m128i R3 = _mm_and_si128(_mm_xor_si128(_mm_srli_epi16(Z, 2), _mm_srli_epi16(Y, 6)), m6);
            const __m128i sc = q % 2 ? _mm_unpackhi_epi16(s16[q / 2], s16[q / 2]) : _mm_unpacklo_epi16(s16[q / 2], s16[q / 2]);
            __m128i p = _mm_add_epi16(_mm_maddubs_epi16(R0, ALOAD(v)), _mm_maddubs_epi16(R1, ALOAD(v + 64)));
            p = _mm_add_epi16(p, _mm_maddubs_epi16(R2, ALOAD(v + 128)));
            p = _mm_add_epi16(_mm_add_epi16(p, _mm_maddubs_epi16(R3, ALOAD(v + 192))), ALOAD(corr + 8 * q));
            si = _mm_add_epi32(si, _mm_madd_epi16(p, sc));
        }
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(si), _mm_set1_ps(fm_half(x[b].d) * y[b].d)));
    }
    return hsum128_ps(acc);
}
