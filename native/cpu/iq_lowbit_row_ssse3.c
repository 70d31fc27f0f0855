/* SSSE3 dot products of the 3- and 1-bit i-quants (IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with 8-bit
 * activations: the arithmetic of the AVX2 kernels (iq_lowbit_batch_avx2.c) on 128-bit registers, a sub-block as two halves of
 * 16 values. Built with -mssse3 and nothing wider. */
#include <tmmintrin.h>
#include "quants.h"
#include "simd128.h"
#include "iq_lowbit.h"
#include "iq_simd128.h"

#define INLINE static inline __attribute__((always_inline))
#define ACT(p) _mm_load_si128((const __m128i *)(p))   // activation rows are 16-byte aligned (quants.h)

// pshufb patterns that copy bytes 0, 1 (half 0) or 2, 3 (half 1) of a broadcast sign word 8
// times each, the bit each byte then tests, and those that broadcast int16 lane k (PATTERNS' rows)
static const uint8_t SPREAD[2][16] __attribute__((aligned(16))) = {
    { 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1 }, { 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3 } };
static const uint8_t BITS[16] __attribute__((aligned(16))) = { 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128 };
static const uint8_t LANE[8][16] __attribute__((aligned(16))) = {
#define H(k) 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, \
             2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1
    { H(0) }, { H(1) }, { H(2) }, { H(3) }, { H(4) }, { H(5) }, { H(6) }, { H(7) },
#undef H
};

INLINE __m128i lane(__m128i v, int k) { return _mm_shuffle_epi8(v, _mm_load_si128((const __m128i *)LANE[k])); }

INLINE int32_t hsum_epi32(__m128i s) {
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// the `psignb` operand of half h of a broadcast sign word: negative where the value is, else 0x7F
INLINE __m128i sign_operand(__m128i word, int h) {
    const __m128i bits = _mm_load_si128((const __m128i *)BITS);
    const __m128i spread = _mm_and_si128(_mm_shuffle_epi8(word, _mm_load_si128((const __m128i *)SPREAD[h])), bits);
    return _mm_add_epi8(spread, _mm_set1_epi8(0x7F));   // bit + 0x7F: negative where the bit is set
}

// the sign words of 4 IQ3_XXS sub-blocks (as iq3xxs_sign_words in iq_simd256.h)
INLINE __m128i iq3xxs_sign_words(__m128i aux) {
    const __m128i f = _mm_set1_epi32(0x7F);
    const __m128i b = _mm_or_si128(
        _mm_or_si128(_mm_and_si128(aux, f), _mm_and_si128(_mm_slli_epi32(aux, 1), _mm_slli_epi32(f, 8))),
        _mm_or_si128(_mm_and_si128(_mm_slli_epi32(aux, 2), _mm_slli_epi32(f, 16)),
                     _mm_and_si128(_mm_slli_epi32(aux, 3), _mm_slli_epi32(f, 24))));
    __m128i p = _mm_xor_si128(b, _mm_srli_epi32(b, 4));
    p = _mm_xor_si128(p, _mm_srli_epi32(p, 2));
    p = _mm_xor_si128(p, _mm_srli_epi32(p, 1));
    return _mm_or_si128(b, _mm_slli_epi32(_mm_and_si128(p, _mm_set1_epi8(1)), 7));
}

// the 16 grid values u . the 16 activations a with the signs of half h of `word`, int16 pairs
INLINE __m128i signed_half(__m128i u, const int8_t *a, __m128i word, int h) {
    return _mm_maddubs_epi16(u, _mm_sign_epi8(ACT(a), sign_operand(word, h)));
}

// acc + (the int16 products of a sub-block's two halves) . scale: their sum stays exact in int16
// (|sum| <= 4 * 62 * 127 for IQ3_XXS's largest grid value), so one `pmaddwd` scales both
INLINE __m128i scaled_sum(__m128i acc, __m128i p0, __m128i p1, __m128i scale) {
    return _mm_add_epi32(acc, _mm_madd_epi16(_mm_add_epi16(p0, p1), scale));
}

#define GATHER4(grid, ix) _mm_set_epi32((int)grid[ix(3)], (int)grid[ix(2)], (int)grid[ix(1)], (int)grid[ix(0)])
#define GATHER2(grid, ix) _mm_set_epi64x((long long)grid[ix(1)], (long long)grid[ix(0)])

float fm_dot_iq3_xxs_a8_ssse3(int n, const void *w, const void *a) {
    const block_iq3_xxs *x = w;
    const block_a8_256 *y = a;
    float s = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i aux0 = _mm_loadu_si128((const __m128i *)x[b].scales_signs);
        const __m128i aux1 = _mm_loadu_si128((const __m128i *)(x[b].scales_signs + 16));
        const __m128i words[2] = { iq3xxs_sign_words(aux0), iq3xxs_sign_words(aux1) };
        const __m128i one = _mm_set1_epi32(1);
        const __m128i sc = _mm_packs_epi32(_mm_or_si128(_mm_slli_epi32(_mm_srli_epi32(aux0, 28), 1), one),
                                           _mm_or_si128(_mm_slli_epi32(_mm_srli_epi32(aux1, 28), 1), one));
        __m128i acc = _mm_setzero_si128();
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = x[b].qs + 8 * j;
            const __m128i word = _mm_shuffle_epi32(words[j / 4], 0x55 * (j % 4));
            const __m128i scale = lane(sc, j);
#define IX0(k) q[k]
#define IX1(k) q[4 + (k)]
            acc = scaled_sum(acc, signed_half(GATHER4(fm_iq3xxs_grid, IX0), y[b].qs + 32 * j, word, 0),
                             signed_half(GATHER4(fm_iq3xxs_grid, IX1), y[b].qs + 32 * j + 16, word, 1), scale);
#undef IX0
#undef IX1
        }
        s += fm_iq_block_scale(fm_half(x[b].d), y[b].d, FM_IQ3XXS_POW2) * (float)hsum_epi32(acc);
    }
    return s;
}

float fm_dot_iq3_s_a8_ssse3(int n, const void *w, const void *a) {
    const block_iq3_s *x = w;
    const block_a8_256 *y = a;
    float s = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i sc = iq3s_scales(x + b);
        __m128i acc = _mm_setzero_si128();
        uint16_t idx[64];
        iq3s_indices(x + b, idx);
        IQ_INDICES_IN_MEMORY(idx);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 8; j++) {
            const __m128i word = _mm_set1_epi32((int)fm_iq3s_signs(x + b, j));
            const __m128i scale = lane(sc, j);
#define IX0(k) idx[8 * j + (k)]
#define IX1(k) idx[8 * j + 4 + (k)]
            acc = scaled_sum(acc, signed_half(GATHER4(fm_iq3s_grid, IX0), y[b].qs + 32 * j, word, 0),
                             signed_half(GATHER4(fm_iq3s_grid, IX1), y[b].qs + 32 * j + 16, word, 1), scale);
#undef IX0
#undef IX1
        }
        s += fm_iq_block_scale(fm_half(x[b].d), y[b].d, FM_IQ3S_POW2) * (float)hsum_epi32(acc);
    }
    return s;
}

// acc + (16 bytes of fm_iq1_grid8 u . 16 activations) . scale
INLINE __m128i grid8_dot(__m128i acc, __m128i u, const int8_t *a, __m128i scale) {
    return _mm_add_epi32(acc, _mm_madd_epi16(_mm_maddubs_epi16(u, ACT(a)), scale));
}

float fm_dot_iq1_s_a8_ssse3(int n, const void *w, const void *a) {
    const block_iq1_s *x = w;
    const block_a8_256 *y = a;
    float s = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i ls = iq1s_scales(x + b);
        // minus 16 ls . (the sums of each 32 activations), iq_lowbit.h
        __m128i acc = _mm_sub_epi32(_mm_setzero_si128(),
                                    _mm_slli_epi32(_mm_madd_epi16(ls, _mm_load_si128((const __m128i *)y[b].sums32)), 4));
        uint16_t idx[32];
        iq1s_indices(x + b, idx);
        IQ_INDICES_IN_MEMORY(idx);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 8; j++) {
            const __m128i scale = lane(ls, j);
#define IX0(l) idx[4 * j + (l)]
#define IX1(l) idx[4 * j + 2 + (l)]
            acc = scaled_sum(acc, _mm_maddubs_epi16(GATHER2(fm_iq1_grid8, IX0), ACT(y[b].qs + 32 * j)),
                             _mm_maddubs_epi16(GATHER2(fm_iq1_grid8, IX1), ACT(y[b].qs + 32 * j + 16)), scale);
#undef IX0
#undef IX1
        }
        s += fm_iq_block_scale(fm_half(x[b].d), y[b].d, FM_IQ1_POW2) * (float)hsum_epi32(acc);
    }
    return s;
}

float fm_dot_iq1_m_a8_ssse3(int n, const void *w, const void *a) {
    const block_iq1_m *x = w;
    const block_a8_256 *y = a;
    float s = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m128i ls[2];
        iq1m_scales(x + b, &ls[0], &ls[1]);
        // minus 16 ls . (the sums of each 16 activations)
        const __m128i c = _mm_add_epi32(_mm_madd_epi16(ls[0], _mm_load_si128((const __m128i *)y[b].bsums)),
                                        _mm_madd_epi16(ls[1], _mm_load_si128((const __m128i *)(y[b].bsums + 8))));
        __m128i acc = _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(c, 4));
        uint16_t idx[32];
        iq1m_indices(x + b, idx);
        IQ_INDICES_IN_MEMORY(idx);
        _Pragma("GCC unroll 16")
        for (int t = 0; t < 16; t++) {
#define IX(l) idx[2 * t + (l)]
            acc = grid8_dot(acc, GATHER2(fm_iq1_grid8, IX), y[b].qs + 16 * t, lane(ls[t / 8], t % 8));
#undef IX
        }
        s += fm_iq_block_scale(fm_half(fm_iq1m_d(x + b)), y[b].d, FM_IQ1_POW2) * (float)hsum_epi32(acc);
    }
    return s;
}
