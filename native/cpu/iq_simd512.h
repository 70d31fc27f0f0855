/* 512-bit helpers of the AVX-512 kernels of the 3- and 1-bit i-quants (iq_lowbit_batch_avx512.c,
 * iq_lowbit_batch_avx512vbmi.c): scale patterns, the dot of two sub-blocks with every activation
 * row, the block's finish. For files built with at least the AVX-512 F/BW/VL/VNNI flags. */
#ifndef FERMIUM_IQ_SIMD512_H
#define FERMIUM_IQ_SIMD512_H
#include "iq_simd256.h"

#define INLINE static inline __attribute__((always_inline))
#define LOAD512(p) _mm512_loadu_si512((const void *)(p))

// pshufb patterns over 8 int16 scales broadcast to the 4 lanes. IQ_LANE_OF(k): int16 lane k in
// all 8 of a lane; PAIR[k]: lane 2k in lanes 0 and 1 (sub-block 2k's values), 2k+1 in lanes 2 and 3
#define IQ_LANE_OF(k) 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, \
                      2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1
static const uint8_t PAIR[4][64] __attribute__((aligned(64))) = {
    { IQ_LANE_OF(0), IQ_LANE_OF(0), IQ_LANE_OF(1), IQ_LANE_OF(1) }, { IQ_LANE_OF(2), IQ_LANE_OF(2), IQ_LANE_OF(3), IQ_LANE_OF(3) },
    { IQ_LANE_OF(4), IQ_LANE_OF(4), IQ_LANE_OF(5), IQ_LANE_OF(5) }, { IQ_LANE_OF(6), IQ_LANE_OF(6), IQ_LANE_OF(7), IQ_LANE_OF(7) } };

INLINE __m512i pick512(__m128i scales8, const uint8_t *pattern) {
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(scales8), _mm512_load_si512((const void *)pattern));
}

// two 256-bit gathers as one register: sub-block 2k in the low half
INLINE __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

#define ACT(i, b) (((const block_a8_256 *)acts[i]) + (b))

// acc[i] += (u . the 64 activations k of row i, negated under mask m) . scale
#define PAIR_DOT(u, m, scale, k)                                                             \
    _Pragma("GCC unroll 4")                                                                 \
    for (int i = 0; i < na; i++) {                                                          \
        const __m512i a = LOAD512(ACT(i, b)->qs + 64 * (k));                                \
        const __m512i p = _mm512_maddubs_epi16(u, _mm512_mask_sub_epi8(a, m, _mm512_setzero_si512(), a)); \
        acc[i] = _mm512_dpwssd_epi32(acc[i], p, scale);                                     \
    }
#define PAIR_DOT_UNSIGNED(u, scale, k)                                                       \
    _Pragma("GCC unroll 4")                                                                 \
    for (int i = 0; i < na; i++)                                                            \
        acc[i] = _mm512_dpwssd_epi32(acc[i], _mm512_maddubs_epi16(u, LOAD512(ACT(i, b)->qs + 64 * (k))), scale);

#define FINISH_BLOCK(dw, pow2)                                                              \
    _Pragma("GCC unroll 4")                                                                 \
    for (int i = 0; i < na; i++)                                                            \
        s[i] += fm_iq_block_scale(dw, ACT(i, b)->d, pow2) * (float)_mm512_reduce_add_epi32(acc[i]);

#define ZERO_ACC()                                                                           \
    __m512i acc[FM_DOTN_MAX];                                                               \
    _Pragma("GCC unroll 4")                                                                 \
    for (int i = 0; i < na; i++) acc[i] = _mm512_setzero_si512();

INLINE uint64_t load64(const void *p) {
    uint64_t v;
    __builtin_memcpy(&v, p, 8);
    return v;
}

#endif
