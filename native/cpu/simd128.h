/* 128-bit helpers shared by every kernel file: SSE only, so safe in the files built with
 * -mssse3 and nothing wider; simd256.h builds on it. Each file gets its own copy. */
#ifndef FERMIUM_SIMD128_H
#define FERMIUM_SIMD128_H
#include <tmmintrin.h>

static inline __attribute__((always_inline)) float hsum128_ps(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

#endif
