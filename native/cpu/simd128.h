/* 128-bit helpers shared by every kernel file: SSE only, so safe in the files built with
 * -mssse3 and nothing wider; simd256.h builds on it. Each file gets its own copy. */
#ifndef FERMIUM_SIMD128_H
#define FERMIUM_SIMD128_H
#include <tmmintrin.h>
#include "quants.h"

static inline __attribute__((always_inline)) float hsum128_ps(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) float hmax128_ps(__m128 s) {
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

// the f16 scales of weight blocks b..b+3 (their first two bytes, stride bytes apart), each in
// the high 16 bits of a 32-bit lane, the low ones zero: put together in a general register and
// moved over, 2 vector operations where four `pinsrw` took 5 on the vector pipes, which bound
// these kernels (the integer pipes are idle here)
static inline __attribute__((always_inline)) __m128i f16x4_high(const uint8_t *first, size_t stride) {
    uint16_t h[4];
    for (int k = 0; k < 4; k++) __builtin_memcpy(&h[k], first + k * stride, 2);
    const uint64_t four = h[0] | (uint64_t)h[1] << 16 | (uint64_t)h[2] << 32 | (uint64_t)h[3] << 48;
    return _mm_unpacklo_epi16(_mm_setzero_si128(), _mm_cvtsi64_si128((long long)four));
}

// four f16 scales, each in the high half of a 32-bit lane, as f32 by a multiply: an arithmetic
// shift by 3 keeps each scale's sign in bit 31 and puts exponent and mantissa in place (the sign
// copies in bits 30..28 masked off), then the exponent is rebiased by 2^(127-15). Normal and subnormal
// values exact (a subnormal scale is a subnormal float here: one microcode assist, and read as
// zero under denormals-are-zero, which the pool therefore leaves off, internal.h); 3 vector
// operations after the gather, where a conversion that avoided subnormal floats took 9
static inline __attribute__((always_inline)) __m128 half4_ps(__m128i high) {
    const __m128i bits = _mm_and_si128(_mm_srai_epi32(high, 3), _mm_set1_epi32((int)0x8FFFFFFF));
    return _mm_mul_ps(_mm_castsi128_ps(bits), _mm_set1_ps(0x1p112f));
}

static inline __attribute__((always_inline)) __m128 half4_gathered(const uint8_t *first, size_t stride) {
    return half4_ps(f16x4_high(first, stride));
}

// the 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of a Q4_K/Q5_K super-block, unpacked in
// general registers and moved over in two quadwords. Stored as words and loaded as one vector,
// they waited on a failed store forwarding (a shuffle-and-mask unpack in vector registers was
// slower than either)
static inline __attribute__((always_inline)) __m128i k4_scales_mins(const uint8_t *packed) {
    uint32_t sm[4];
    fm_unpack_scales_k4(packed, sm);
    return _mm_unpacklo_epi64(_mm_cvtsi64_si128((long long)(sm[0] | (uint64_t)sm[1] << 32)),
                              _mm_cvtsi64_si128((long long)(sm[2] | (uint64_t)sm[3] << 32)));
}

// a Q4_K/Q5_K super-block's 8 scales as int16, and sum_j min_j * sums32[j] as 4 int32 partial
// sums (sums32: the activation block's sums of each 32 values, 16-byte aligned, quants.h)
static inline __attribute__((always_inline)) __m128i k4_scales16(const uint8_t *packed, const int16_t *sums32,
                                                                  __m128i *mins_dot) {
    const __m128i v = k4_scales_mins(packed), zero = _mm_setzero_si128();
    *mins_dot = _mm_madd_epi16(_mm_unpackhi_epi8(v, zero), _mm_load_si128((const __m128i *)sums32));
    return _mm_unpacklo_epi8(v, zero);
}

// the activation sums of values 64t..64t+31 and 64t+32..64t+63 as the int16 halves of one int32
static inline __attribute__((always_inline)) int32_t a8_sums32_pair(const int16_t *sums32, int t) {
    int32_t pair;
    __builtin_memcpy(&pair, sums32 + 2 * t, sizeof pair);
    return pair;
}

// a Q6_K super-block's 16 int8 scales as int16: s16[0] scales 0..7, s16[1] 8..15
static inline __attribute__((always_inline)) void q6_scales16(const int8_t *scales, __m128i s16[2]) {
    const __m128i s8 = _mm_loadu_si128((const __m128i *)scales);
    s16[0] = _mm_srai_epi16(_mm_unpacklo_epi8(s8, s8), 8);
    s16[1] = _mm_srai_epi16(_mm_unpackhi_epi8(s8, s8), 8);
}

// those scales (q6_scales16), and the start of the block's integer sum: the stored quants are
// offset by +32, so -32 * sum_g scale[g] * bsum[g] (4 int32 partial sums)
static inline __attribute__((always_inline)) __m128i q6_scales_offset(const int8_t *scales, const int16_t *bsums, __m128i s16[2]) {
    q6_scales16(scales, s16);
    const __m128i c = _mm_add_epi32(_mm_madd_epi16(s16[0], _mm_load_si128((const __m128i *)bsums)),
                                    _mm_madd_epi16(s16[1], _mm_load_si128((const __m128i *)(bsums + 8))));
    return _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(c, 5));
}

// the 6-bit scales and mins of a repacked Q4_K group (quants.h), from the byte planes of the
// packed scales: sc[t] holds scales 2t and 2t+1 of the 8 rows (8 bytes each), mn[t] the mins
static inline __attribute__((always_inline)) void q4k_scales8(const uint8_t planes[12][FM_GROUP], __m128i sc[4], __m128i mn[4]) {
#define PLANES(c) _mm_loadu_si128((const __m128i *)planes[c])   // bytes c and c+1 of every row
    const __m128i m6 = _mm_set1_epi8(63), m4 = _mm_set1_epi8(0xF), top = _mm_set1_epi8(0x30);
    const __m128i p01 = PLANES(0), p23 = PLANES(2), p45 = PLANES(4), p67 = PLANES(6), p89 = PLANES(8), pab = PLANES(10);
#undef PLANES
    sc[0] = _mm_and_si128(p01, m6);
    sc[1] = _mm_and_si128(p23, m6);
    mn[0] = _mm_and_si128(p45, m6);
    mn[1] = _mm_and_si128(p67, m6);
    // sub-blocks 4..7: low 4 bits from bytes 8..11, top 2 bits from bits 6..7 of bytes 0..7
    sc[2] = _mm_or_si128(_mm_and_si128(p89, m4), _mm_and_si128(_mm_srli_epi16(p01, 2), top));
    sc[3] = _mm_or_si128(_mm_and_si128(pab, m4), _mm_and_si128(_mm_srli_epi16(p23, 2), top));
    mn[2] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(p89, 4), m4), _mm_and_si128(_mm_srli_epi16(p45, 2), top));
    mn[3] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(pab, 4), m4), _mm_and_si128(_mm_srli_epi16(p67, 2), top));
}

#endif
