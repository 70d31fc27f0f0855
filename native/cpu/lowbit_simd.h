/* 128-bit helpers of the lower-bit super-block kernels (lowbit_row_ssse3.c, lowbit_body256.h):
 * SSSE3 only, so safe in the files built with -mssse3 and nothing wider. */
#ifndef FERMIUM_LOWBIT_SIMD_H
#define FERMIUM_LOWBIT_SIMD_H
#include <tmmintrin.h>
#include "lowbit.h"

// a Q3_K super-block's 16 scales (0..63, the scale plus 32) as bytes, moved over in two quadwords
static inline __attribute__((always_inline)) __m128i q3k_scales8(const uint8_t *packed) {
    uint32_t w[4];
    fm_q3k_scale_words(packed, w);
    return _mm_unpacklo_epi64(_mm_cvtsi64_si128((long long)(w[0] | (uint64_t)w[1] << 32)),
                              _mm_cvtsi64_si128((long long)(w[2] | (uint64_t)w[3] << 32)));
}

// an IQ4_XS super-block's 8 sub-block scales as int16, less their offset (-32..31): int16 lane i
// takes byte i / 2 of scales_l, times 16 (even i) or 1 (odd i), so that bits 4..7 of it hold the
// low 4 bits of the scale; and scales_h times 2^(14 - 2i), whose top 2 bits are the scale's
static inline __attribute__((always_inline)) __m128i iq4xs_scales16(const block_iq4_xs *x) {
    uint32_t l;
    __builtin_memcpy(&l, x->scales_l, 4);
    const __m128i bytes = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)l),
                                           _mm_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1));
    const __m128i lo = _mm_and_si128(_mm_srli_epi16(_mm_mullo_epi16(bytes, _mm_setr_epi16(16, 1, 16, 1, 16, 1, 16, 1)), 4),
                                     _mm_set1_epi16(0xF));
    const __m128i hi = _mm_srli_epi16(_mm_mullo_epi16(_mm_set1_epi16((short)x->scales_h),
                                      _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6, 1 << 4, 1 << 2, 1)), 14);
    return _mm_sub_epi16(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi16(32));
}

// the code book of IQ4_XS (and IQ4_NL), for `pshufb`
static inline __attribute__((always_inline)) __m128i iq4_codebook(void) {
    return _mm_loadu_si128((const __m128i *)fm_kvalues_iq4nl);
}

// TQ1_0's bytes times 3 (mod 256), the next ternary digit's byte
static inline __attribute__((always_inline)) __m128i times3_epi8(__m128i p) { return _mm_add_epi8(p, _mm_add_epi8(p, p)); }

// the digit (3 * p) >> 8 of each byte p (lowbit.h): 3p/4 by two rounding averages, from p - 1
// so that they round as a floor would (exact for every byte), then its top two bits
static inline __attribute__((always_inline)) __m128i trits_epi8(__m128i p) {
    const __m128i x = _mm_subs_epu8(p, _mm_set1_epi8(1));
    const __m128i s = _mm_avg_epu8(x, _mm_avg_epu8(x, _mm_setzero_si128()));
    return _mm_and_si128(_mm_srli_epi16(s, 6), _mm_set1_epi8(3));
}

// the 16 bytes of a TQ1_0 block that hold values 240..255 (digit 0 of each): qh times 1, 3, 9, 27
static inline __attribute__((always_inline)) __m128i tq1_qh_bytes(const uint8_t *qh) {
    uint32_t h;
    __builtin_memcpy(&h, qh, 4);
    const __m128i q1 = _mm_cvtsi32_si128((int)h), q3 = times3_epi8(q1), q9 = times3_epi8(q3), q27 = times3_epi8(q9);
    return _mm_unpacklo_epi64(_mm_unpacklo_epi32(q1, q3), _mm_unpacklo_epi32(q9, q27));
}

#endif
