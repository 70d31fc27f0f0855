/* 512-bit helpers shared by the AVX-512 kernel files (row and batched). Include only from
 * files built with the AVX-512 flags; each file gets its own copy. */
#ifndef FERMIUM_SIMD512_H
#define FERMIUM_SIMD512_H
#include <immintrin.h>
#include <stdint.h>
#include "simd256.h"

static inline __attribute__((always_inline)) __m512i join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// lanes 0..7 = dd[k], lanes 8..15 = dd[k+1] (dd: eight block scales in the low lanes)
static inline __attribute__((always_inline)) __m512 lane_pair(__m512 dd, int k) {
    return _mm512_permutexvar_ps(join(_mm256_set1_epi32(k), _mm256_set1_epi32(k + 1)), dd);
}

// pshufb patterns over 8 x int16 scales repeated in each 128-bit lane. Row k picks, in the
// four lanes, scales a, a, b, b with (a, b) = (2k, 2k+1) for rows 0..3 (Q4_K/Q5_K steps of
// 64 quants: two sub-blocks of 32); rows 4 and 5 pick 0, 1, 2, 3 and 4, 5, 6, 7 (Q6_K: one
// scale per 16 quants).
#define W(s) 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1, \
             2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1
static const uint8_t PATTERNS512[6][64] __attribute__((aligned(64))) = {
    { W(0), W(0), W(1), W(1) }, { W(2), W(2), W(3), W(3) }, { W(4), W(4), W(5), W(5) },
    { W(6), W(6), W(7), W(7) }, { W(0), W(1), W(2), W(3) }, { W(4), W(5), W(6), W(7) },
};
#undef W

static inline __attribute__((always_inline)) __m512i pick512(__m512i sc, int row) {
    return _mm512_shuffle_epi8(sc, _mm512_load_si512((const void *)PATTERNS512[row]));
}

// si += scale . (u . a): 64 unsigned quants, 64 activations
static inline __attribute__((always_inline)) __m512i step512(__m512i si, __m512i u, const int8_t *a, __m512i scale) {
    return _mm512_dpwssd_epi32(si, _mm512_maddubs_epi16(u, _mm512_loadu_si512((const void *)a)), scale);
}

// the 64 6-bit quants of Q6_K group pair (0, 1) or (2, 3) of one 128-value half (simd256.h)
static inline __attribute__((always_inline)) __m512i q6_quants(const uint8_t *ql, const uint8_t *qh, int pair) {
    return join(q6_group(ql, qh, 2 * pair), q6_group(ql, qh, 2 * pair + 1));
}

#endif
