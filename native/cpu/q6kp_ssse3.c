/* SSSE3 dot product of a Q6_Kp row (Q6_K repacked, quants.h) with 8-bit activations in the
 * same order: per 64 values, 11 operations unpack four registers of quants, and each pair of
 * registers that share their sub-blocks goes through one `pmaddwd` with the scales. About 5.8
 * vector operations per 16 values against 8.3 for the GGUF layout (dotk_ssse3.c).
 * Built with -mssse3 only; must hold no AVX instruction. */
#include <tmmintrin.h>
#include "quants.h"
#include "simd128.h"

#define LOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define ALOAD(p) _mm_load_si128((const __m128i *)(p))   // activation quants and sums: 16-byte aligned (quants.h)

// pshufb patterns over 8 int16 scales: scale 2k to int16 lanes 0..3, scale 2k+1 to lanes 4..7
static const uint8_t PAIR[4][16] __attribute__((aligned(16))) = {
#define P(s, t) { 2 * s, 2 * s + 1, 2 * s, 2 * s + 1, 2 * s, 2 * s + 1, 2 * s, 2 * s + 1, \
                  2 * t, 2 * t + 1, 2 * t, 2 * t + 1, 2 * t, 2 * t + 1, 2 * t, 2 * t + 1 }
    P(0, 1), P(2, 3), P(4, 5), P(6, 7)
#undef P
};

float fm_dot_q6_Kp_a8_ssse3(int n, const void *w, const void *a) {
    const block_q6_Kp *x = w;
    const block_a8_256 *y = a;
    const __m128i m6 = _mm_set1_epi8(63), m4 = _mm_set1_epi8(0xF), top = _mm_set1_epi8(0x30);
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m128i s16[2];
        __m128i si = q6_scales_offset(x[b].scales, y[b].bsums, s16);
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++)
            _Pragma("GCC unroll 2")
            for (int l = 0; l < 2; l++) {   // lane l of registers A..D: 64 values, 4 sub-blocks
                const uint8_t *pl = x[b].planes[h][0] + 16 * l;
                const int8_t *v = y[b].qs + 128 * h + 16 * l;   // A, B, C, D 32 bytes apart
                const __m128i X = LOAD(pl), Y = LOAD(pl + 32), Z = LOAD(pl + 64);
                const __m128i A = _mm_and_si128(X, m6), B = _mm_and_si128(Y, m6);
                const __m128i C = _mm_or_si128(_mm_and_si128(Z, m4), _mm_and_si128(_mm_srli_epi16(X, 2), top));
                const __m128i D = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(Z, 4), m4), _mm_and_si128(_mm_srli_epi16(Y, 2), top));
                const __m128i ab = _mm_add_epi16(_mm_maddubs_epi16(A, ALOAD(v)), _mm_maddubs_epi16(B, ALOAD(v + 32)));
                const __m128i cd = _mm_add_epi16(_mm_maddubs_epi16(C, ALOAD(v + 64)), _mm_maddubs_epi16(D, ALOAD(v + 96)));
                si = _mm_add_epi32(si, _mm_madd_epi16(ab, _mm_shuffle_epi8(s16[h], _mm_load_si128((const __m128i *)PAIR[2 * l]))));
                si = _mm_add_epi32(si, _mm_madd_epi16(cd, _mm_shuffle_epi8(s16[h], _mm_load_si128((const __m128i *)PAIR[2 * l + 1]))));
            }
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(si), _mm_set1_ps(fm_half(x[b].d) * y[b].d)));
    }
    return hsum128_ps(acc);
}
