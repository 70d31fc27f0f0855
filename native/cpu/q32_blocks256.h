/* The blocks of the other 32-value types (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) in 256-bit
 * registers, for the AVX2 and AVX-512 kernels (q32_batch_*.c): per type T, T_dw: the scales of
 * 8 blocks from x on; T_c: their c, what each block adds per unit of the activation block's sum
 * (the min, or -offset * dw where the bytes are the code plus an offset: 16 for Q5_0, 12 for
 * MXFP4); T_u: one block's 32 bytes (value j in byte j); T_dw1, T_c1: one block's dw and c (the
 * tails). Include only from files built with at least -mavx2 -mf16c. */
#ifndef FERMIUM_Q32_BLOCKS256_H
#define FERMIUM_Q32_BLOCKS256_H
#include <immintrin.h>
#include "quants.h"
#include "simd256.h"
#include "../iq_tables.h"

#define INLINE static inline __attribute__((always_inline))
#define MXFP4_OFFSET 12   // the code book's -12..12 as unsigned bytes

// the 32 nibbles of a block, values 0..15 (low nibbles) then 16..31: one broadcast load, a shift
// of the high lane and a mask, where q4_nibbles (simd256.h) takes an insert more
INLINE __m256i nibbles32(const uint8_t *qs) {
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0)), _mm256_set1_epi8(0xF));
}

// bit j of a 5-bit block's qh, as 0x10 in byte j (byte j takes qh byte j / 8, and one bit of it)
INLINE __m256i fifth_bits(const uint8_t *qh) {
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    uint32_t h;
    __builtin_memcpy(&h, qh, 4);
    const __m256i bytes = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), pick), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(bytes, bit), _mm256_set1_epi8(0x10));
}

// the f16 `field` of blocks x[0..7] as floats: put together four at a time in general registers
// and moved over in two quadwords, where eight `vpinsrw` (scales8, simd256.h) take twice the
// vector operations
INLINE __m256 f16x8(const uint8_t *first, size_t stride) {
    uint64_t four[2];
    for (int h = 0; h < 2; h++) {
        uint16_t v[4];
        for (int k = 0; k < 4; k++) __builtin_memcpy(&v[k], first + (4 * h + k) * stride, 2);
        four[h] = v[0] | (uint64_t)v[1] << 16 | (uint64_t)v[2] << 32 | (uint64_t)v[3] << 48;
    }
    return _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm_cvtsi64_si128((long long)four[0]), _mm_cvtsi64_si128((long long)four[1])));
}
#define F16_AT(x, field) f16x8((const uint8_t *)&(x)->field, sizeof *(x))

INLINE __m256 q4_1_dw(const block_q4_1 *x) { return F16_AT(x, d); }
INLINE __m256 q4_1_c(const block_q4_1 *x, __m256 dw) { (void)dw; return F16_AT(x, m); }
INLINE __m256i q4_1_u(const block_q4_1 *x, __m256i book) { (void)book; return nibbles32(x->qs); }
INLINE float q4_1_dw1(const block_q4_1 *x) { return _cvtsh_ss(x->d); }
INLINE float q4_1_c1(const block_q4_1 *x) { return _cvtsh_ss(x->m); }

INLINE __m256 q5_0_dw(const block_q5_0 *x) { return F16_AT(x, d); }
INLINE __m256 q5_0_c(const block_q5_0 *x, __m256 dw) { (void)x; return _mm256_mul_ps(dw, _mm256_set1_ps(-16.0f)); }
INLINE __m256i q5_0_u(const block_q5_0 *x, __m256i book) {
    (void)book;
    return _mm256_or_si256(nibbles32(x->qs), fifth_bits(x->qh));
}
INLINE float q5_0_dw1(const block_q5_0 *x) { return _cvtsh_ss(x->d); }
INLINE float q5_0_c1(const block_q5_0 *x) { return -16.0f * _cvtsh_ss(x->d); }

INLINE __m256 q5_1_dw(const block_q5_1 *x) { return F16_AT(x, d); }
INLINE __m256 q5_1_c(const block_q5_1 *x, __m256 dw) { (void)dw; return F16_AT(x, m); }
INLINE __m256i q5_1_u(const block_q5_1 *x, __m256i book) {
    (void)book;
    return _mm256_or_si256(nibbles32(x->qs), fifth_bits(x->qh));
}
INLINE float q5_1_dw1(const block_q5_1 *x) { return _cvtsh_ss(x->d); }
INLINE float q5_1_c1(const block_q5_1 *x) { return _cvtsh_ss(x->m); }

INLINE __m256 iq4_nl_dw(const block_iq4_nl *x) { return F16_AT(x, d); }
INLINE __m256i iq4_nl_u(const block_iq4_nl *x, __m256i book) { return _mm256_shuffle_epi8(book, nibbles32(x->qs)); }
INLINE float iq4_nl_dw1(const block_iq4_nl *x) { return _cvtsh_ss(x->d); }
// the c of IQ4_NL's code book offset by 128 into unsigned bytes, for `vpdpbusd` (AVX-512; the
// AVX2 kernel keeps the values signed and has no c)
INLINE __m256 iq4_nl_c(const block_iq4_nl *x, __m256 dw) { (void)x; return _mm256_mul_ps(dw, _mm256_set1_ps(-128.0f)); }
INLINE float iq4_nl_c1(const block_iq4_nl *x) { return -128.0f * _cvtsh_ss(x->d); }

// 8 exponent bytes, 17 bytes apart, as 2^(e - 128) = 2^(e - 127) / 2 (fm_e8m0_half): the bits
// e << 23 (0x00400000, 2^-127, for e = 0) are exact, and so is the halving, folded into da
// (mxfp4_half) so that dw * da rounds once, as the generic kernel's product does
INLINE __m256 mxfp4_dw(const block_mxfp4 *x) {
    uint64_t e = 0;
    for (int k = 0; k < 8; k++) e |= (uint64_t)x[k].e << (8 * k);
    const __m256i bits = _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)e)), 23);
    return _mm256_castsi256_ps(_mm256_max_epi32(bits, _mm256_set1_epi32(0x00400000)));
}
INLINE __m256 mxfp4_c(const block_mxfp4 *x, __m256 dw) {
    (void)x;
    return _mm256_mul_ps(dw, _mm256_set1_ps(-0.5f * MXFP4_OFFSET));
}
INLINE __m256i mxfp4_u(const block_mxfp4 *x, __m256i book) { return _mm256_shuffle_epi8(book, nibbles32(x->qs)); }
INLINE float mxfp4_dw1(const block_mxfp4 *x) { return fm_e8m0_half(x->e); }
INLINE float mxfp4_c1(const block_mxfp4 *x) { return -(float)MXFP4_OFFSET * fm_e8m0_half(x->e); }

// a 16-value code book in both 128-bit lanes, plus `offset` in every byte
INLINE __m256i book256(const int8_t *values, int offset) {
    return _mm256_add_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)values)),
                           _mm256_set1_epi8((char)offset));
}

#endif
