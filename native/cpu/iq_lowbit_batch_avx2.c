/* AVX2 dot products of the 3- and 1-bit i-quants (IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with up to
 * FM_DOTN_MAX 8-bit activation rows, and with one (iq_body256.h): signs applied to the
 * activations by `psignb`, products scaled by `pmaddwd`. Built with -mavx2 -mfma -mf16c. */
#include "iq_simd256.h"

// the `psignb` operand of a broadcast sign word: -1 where the value is negative, else 1
static inline __attribute__((always_inline)) __m256i sign_operand(__m256i word) {
    const __m256i bits = _mm256_load_si256((const __m256i *)IQ_SIGN_BITS);
    return _mm256_or_si256(_mm256_cmpeq_epi8(iq_spread_signs(word), bits), _mm256_set1_epi8(1));
}

#define SIGNS __m256i
#define SIGNS_U32(w) sign_operand(_mm256_set1_epi32((int)(w)))
#define SIGNS_VEC(words, j) sign_operand(_mm256_permutevar8x32_epi32(words, _mm256_set1_epi32(j)))
#define APPLY(a, s) _mm256_sign_epi8(a, s)
#define DOT_ACC(acc, p, scale) _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale))

#include "iq_body256.h"

IQ_ENTRY_POINTS(avx2)
