/* 256-bit helpers shared by the AVX2 and AVX-512 kernel files. Include only from files built
 * with at least -mavx2 -mf16c: each file gets its own copy, compiled with its own flags. */
#ifndef FERMIUM_SIMD256_H
#define FERMIUM_SIMD256_H
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

static inline __attribute__((always_inline)) float hsum256_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

// the f16 scales of weight blocks b..b+7 (first two bytes of blocks `stride` bytes apart)
static inline __attribute__((always_inline)) __m256 scales8(const uint8_t *first, size_t stride) {
#define AT(k) (*(const uint16_t *)(first + (k) * stride))
    __m128i h = _mm_cvtsi32_si128(AT(0));
    h = _mm_insert_epi16(h, AT(1), 1);
    h = _mm_insert_epi16(h, AT(2), 2);
    h = _mm_insert_epi16(h, AT(3), 3);
    h = _mm_insert_epi16(h, AT(4), 4);
    h = _mm_insert_epi16(h, AT(5), 5);
    h = _mm_insert_epi16(h, AT(6), 6);
    h = _mm_insert_epi16(h, AT(7), 7);
#undef AT
    return _mm256_cvtph_ps(h);
}

#endif
