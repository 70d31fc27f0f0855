/* AVX-512 dot products of the 3- and 1-bit i-quants (IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with up to
 * FM_DOTN_MAX 8-bit activation rows, and with one (iq_body256.h), on 256-bit registers: a sign
 * word negates the activations as a mask (one masked subtraction), and `vpdpwssd` scales and
 * adds each product in one instruction. Built with the AVX-512 F/BW/VL/VNNI flags. */
#include "iq_simd256.h"

#define SIGNS __mmask32
#define SIGNS_U32(w) _cvtu32_mask32(w)
#define SIGNS_VEC(words, j) _mm256_test_epi8_mask(                                         \
    _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(words, _mm256_set1_epi32(j)),         \
                        _mm256_load_si256((const __m256i *)IQ_SIGN_SPREAD)),               \
    _mm256_load_si256((const __m256i *)IQ_SIGN_BITS))
#define APPLY(a, s) _mm256_mask_sub_epi8(a, s, _mm256_setzero_si256(), a)
#define DOT_ACC(acc, p, scale) _mm256_dpwssd_epi32(acc, p, scale)

#include "iq_body256.h"

IQ_ENTRY_POINTS(avx512)
