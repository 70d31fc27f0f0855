/* 256-bit helpers shared by the AVX2 and AVX-512 kernel files. Include only from files built
 * with at least -mavx2 -mf16c: each file gets its own copy, compiled with its own flags. */
#ifndef FERMIUM_SIMD256_H
#define FERMIUM_SIMD256_H
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include "simd128.h"

static inline __attribute__((always_inline)) float hsum256_ps(__m256 v) {
    return hsum128_ps(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

static inline __attribute__((always_inline)) float hmax256_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
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

// the 32 nibbles of a Q4_0 block: low halves (values 0..15), then high halves (16..31)
static inline __attribute__((always_inline)) __m256i q4_nibbles(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0xF));
}

// pshufb patterns over a broadcast 8 x int16 vector: lane k to all 16 lanes (rows 0..7), or
// lane k to the low 128 bits and lane k+1 to the high 128 bits (rows 8..11, k = 0, 2, 4, 6)
static const uint8_t PATTERNS[12][32] __attribute__((aligned(32))) = {
#define H(k) 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, \
             2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1
    { H(0), H(0) }, { H(1), H(1) }, { H(2), H(2) }, { H(3), H(3) },
    { H(4), H(4) }, { H(5), H(5) }, { H(6), H(6) }, { H(7), H(7) },
    { H(0), H(1) }, { H(2), H(3) }, { H(4), H(5) }, { H(6), H(7) },
#undef H
};

// the K-quant sub-block scale(s) of `row` (see PATTERNS) broadcast across a 256-bit vector
static inline __attribute__((always_inline)) __m256i pick(__m256i v, int row) {
    return _mm256_shuffle_epi8(v, _mm256_load_si256((const __m256i *)PATTERNS[row]));
}

// the start of a Q6_K super-block's integer sum: its stored quants are offset by +32, so
// -32 * sum_g scale[g] * bsum[g] over the 16 groups, as 8 int32 partial sums
static inline __attribute__((always_inline)) __m256i q6_offset(__m128i scales8, const int16_t *bsums) {
    const __m256i c = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales8), _mm256_loadu_si256((const __m256i *)bsums));
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(c, 5));
}

// the 8 int16 scales of half h (0, 1) of a Q6_K super-block, in both 128-bit lanes
static inline __attribute__((always_inline)) __m256i q6_half_scales(__m128i scales8, int h) {
    return _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_srli_si128(scales8, 8) : scales8));
}

// the 32 6-bit quants of Q6_K group g (0..3) of one 128-value half: the low (g < 2) or high
// nibbles of ql[32 * (g & 1)..], with bits 2g, 2g+1 of qh[0..32] on top
static inline __attribute__((always_inline)) __m256i q6_group(const uint8_t *ql, const uint8_t *qh, int g) {
    const __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * (g & 1)));
    const __m256i hh = _mm256_loadu_si256((const __m256i *)qh);
    const __m256i lo4 = g < 2 ? l : _mm256_srli_epi16(l, 4);
    const __m256i hi2 = g == 0 ? _mm256_slli_epi16(hh, 4) : g == 1 ? _mm256_slli_epi16(hh, 2)
                      : g == 2 ? hh : _mm256_srli_epi16(hh, 2);
    return _mm256_or_si256(_mm256_and_si256(lo4, _mm256_set1_epi8(0xF)), _mm256_and_si256(hi2, _mm256_set1_epi8(0x30)));
}

// sum over the sub-blocks j of a repacked Q4_K group of min_j . (activation sum of sub-block j),
// one int32 per row; mn8 as q4k_scales8 (simd128.h) gives them, sums32 those of the activation block
static inline __attribute__((always_inline)) __m256i q4k_mins_dot8(const __m128i mn8[4], const int16_t *sums32) {
    __m256i m = _mm256_setzero_si256();
    for (int t = 0; t < 4; t++) {   // mins of sub-blocks 2t, 2t+1 as int16 pairs per row
        const __m256i mp = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8[t], _mm_srli_si128(mn8[t], 8)));
        m = _mm256_add_epi32(m, _mm256_madd_epi16(mp, _mm256_set1_epi32(a8_sums32_pair(sums32, t))));
    }
    return m;
}

// sums += da * (d * si - dmin * mins), the 8 rows of a repacked Q4_K super-block against one
// activation block (scale da): si the scaled quant sums, mins as q4k_mins_dot8 gives them
static inline __attribute__((always_inline)) void q4k_accumulate8(float *sums, __m256i si, __m256i mins,
                                                                  __m256 d, __m256 dmin, float da) {
    const __m256 a = _mm256_set1_ps(da);
    const __m256 v = _mm256_fmsub_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(d, a),
                                     _mm256_mul_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, a)));
    _mm256_store_ps(sums, _mm256_add_ps(_mm256_load_ps(sums), v));
}

// sums += scale * si: a super-block's integer sums (8 int32 partial sums) into the float ones
static inline __attribute__((always_inline)) void accumulate8(float *sums, __m256i si, float scale) {
    _mm256_store_ps(sums, _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(scale), _mm256_load_ps(sums)));
}

// 32 unsigned quants . 32 activations, times an int16 scale vector -> 8 int32
static inline __attribute__((always_inline)) __m256i dot32_scaled(__m256i u, const int8_t *v, __m256i scale) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)v)), scale);
}

#endif
