/* 256-bit helpers of the AVX2 and AVX-512 kernels of the 3- and 1-bit i-quants: IQ3_XXS's sign
 * words and scales, grid gathers, the kernels' entry points. For files built with at least -mavx2 -mf16c. */
#ifndef FERMIUM_IQ_SIMD256_H
#define FERMIUM_IQ_SIMD256_H
#include <immintrin.h>
#include "quants.h"
#include "simd256.h"
#include "iq_lowbit.h"
#include "iq_simd128.h"

// the sign words of the 8 IQ3_XXS sub-blocks (iq_lowbit.h) from their scales_signs words: each
// 7-bit field moved to its byte, with the byte's parity as its bit 7 (what fm_ksigns_iq2xs holds)
IQ_INLINE __m256i iq3xxs_sign_words(__m256i aux) {
    const __m256i f = _mm256_set1_epi32(0x7F);
    const __m256i b = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(aux, f), _mm256_and_si256(_mm256_slli_epi32(aux, 1), _mm256_slli_epi32(f, 8))),
        _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(aux, 2), _mm256_slli_epi32(f, 16)),
                        _mm256_and_si256(_mm256_slli_epi32(aux, 3), _mm256_slli_epi32(f, 24))));
    // bit 0 of each byte: the parity of the byte (the shifts' bits from the next byte land above bit 3,
    // 1 and 0 of the three steps, which the next step does not read)
    __m256i p = _mm256_xor_si256(b, _mm256_srli_epi32(b, 4));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    return _mm256_or_si256(b, _mm256_slli_epi32(_mm256_and_si256(p, _mm256_set1_epi8(1)), 7));
}

// the 8 IQ3_XXS sub-block scales 2 s + 1 as int16, from the top nibbles of the scales_signs words
IQ_INLINE __m128i iq3xxs_scales(__m256i aux) {
    const __m256i ls32 = _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(aux, 28), 1), _mm256_set1_epi32(1));
    return _mm_packs_epi32(_mm256_castsi256_si128(ls32), _mm256_extracti128_si256(ls32, 1));
}

// 8 grid entries of 4 bytes and 4 of 8 bytes, by the indices at p (uint8_t or uint16_t), put
// together by inserts: the hardware gathers (vpgatherdd, vpgatherdq) read slower
#define IQ_GATHER8(grid, p) _mm256_set_epi32((int)grid[(p)[7]], (int)grid[(p)[6]], (int)grid[(p)[5]], (int)grid[(p)[4]], \
                                             (int)grid[(p)[3]], (int)grid[(p)[2]], (int)grid[(p)[1]], (int)grid[(p)[0]])
#define IQ_GATHER4(grid, p) _mm256_set_epi64x((long long)grid[(p)[3]], (long long)grid[(p)[2]], \
                                              (long long)grid[(p)[1]], (long long)grid[(p)[0]])

// an ISA's two entry points of type's kernel type##_n: the batched one and its instance for one
// activation row
#define IQ_KERNELS(type, isa)                                                               \
    FM_DEFINE_DOTN(fm_dotn_##type##_a8_##isa, type##_n, block_##type)                       \
    FM_DEFINE_DOT1(fm_dot_##type##_a8_##isa, type##_n, block_##type)

#endif
