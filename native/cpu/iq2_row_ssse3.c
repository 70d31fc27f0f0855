/* SSSE3 dot products of the 2-bit i-quants (IQ2_XXS, IQ2_XS, IQ2_S) with 8-bit activations in
 * blocks of 256. Per block, iq2_prep.h unpacks the signs and scales; per 16 values, two
 * grid entries are gathered as 64-bit words, the signs are applied to the activations
 * (`psignb`), then `pmaddubsw` with the unsigned
 * grid values and `pmaddwd` with the scale. Built with -mssse3 only. */
#include <tmmintrin.h>
#include "iq2_prep.h"
#include "simd128.h"

#define INLINE static inline __attribute__((always_inline))

// entries k and k + 1 (16 values) of a block
INLINE __m128i grid2(const uint64_t *grid, iq2_index_fn index, const uint8_t *x, const iq2_prep *p, int k) {
    return _mm_set_epi64x((long long)grid[index(x, p, k + 1)], (long long)grid[index(x, p, k + 0)]);
}

// sign bytes j and j + 1 of 16 (four sub-blocks) each spread over 8 bytes, as `psignb` operands
// (iq2_batch_avx2.c): one `pshufb` with a constant pattern, then (byte & bit) + 0x7F
INLINE __m128i sign_of(__m128i signs16, int j) {
    const __m128i bit = _mm_set1_epi64x(0x8040201008040201);
    const __m128i spread = _mm_set_epi64x(0x0101010101010101LL * (j + 1), 0x0101010101010101LL * j);
    return _mm_add_epi8(_mm_and_si128(_mm_shuffle_epi8(signs16, spread), bit), _mm_set1_epi8(0x7F));
}

// the `pmaddubsw` products of 16 grid values and 16 activations signed by sg: int16 pair sums
INLINE __m128i signed_dot(__m128i g, __m128i sg, const int8_t *v) {
    return _mm_maddubs_epi16(g, _mm_sign_epi8(_mm_load_si128((const __m128i *)v), sg));
}

// the sum over blocks of d_w * d_a / 8 * (the integer dot of the block); one_scale: a scale per
// sub-block (IQ2_XXS), whose two halves' products then add up as int16 (2 * 2 * 43 * 127 < 32768)
// before one `pmaddwd`
INLINE float dot_iq2(int n, const uint8_t *x, size_t block_bytes, const block_a8_256 *y, iq2_prep_fn prep,
                     iq2_index_fn index, const uint64_t *grid, int one_scale) {
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++, x += block_bytes) {
        fm_prefetch_ahead(x, block_bytes);
        iq2_prep p;
        prep(x, &p);
        const int8_t *v = y[b].qs;
        __m128i si = _mm_setzero_si128();
        _Pragma("GCC unroll 8")
        for (int ib = 0; ib < QK_K / 32; ib++, v += 32) {
            const __m128i signs16 = _mm_load_si128((const __m128i *)(p.signs + 16 * (ib / 4)));
            const __m128i pick = _mm_set1_epi16((short)(0x0100 + 0x0202 * ib));   // int16 lane ib
            const __m128i p0 = signed_dot(grid2(grid, index, x, &p, 4 * ib), sign_of(signs16, 4 * (ib % 4)), v);
            const __m128i p1 = signed_dot(grid2(grid, index, x, &p, 4 * ib + 2), sign_of(signs16, 4 * (ib % 4) + 2),
                                          v + 16);
            if (one_scale) {
                si = _mm_add_epi32(si, _mm_madd_epi16(_mm_add_epi16(p0, p1), _mm_shuffle_epi8(p.lo, pick)));
            } else {
                si = _mm_add_epi32(si, _mm_madd_epi16(p0, _mm_shuffle_epi8(p.lo, pick)));
                si = _mm_add_epi32(si, _mm_madd_epi16(p1, _mm_shuffle_epi8(p.hi, pick)));
            }
        }
        const float d = fm_half(iq2_d(x)) * y[b].d * 0.125f;
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(si), _mm_set1_ps(d)));
    }
    return hsum128_ps(acc);
}

float fm_dot_iq2_xxs_a8_ssse3(int n, const void *w, const void *a) {
    return dot_iq2(n, w, sizeof(block_iq2_xxs), a, iq2_xxs_prep, iq2_xxs_index, fm_iq2xxs_grid, 1);
}

float fm_dot_iq2_xs_a8_ssse3(int n, const void *w, const void *a) {
    return dot_iq2(n, w, sizeof(block_iq2_xs), a, iq2_xs_prep, iq2_xs_index, fm_iq2xs_grid, 0);
}

float fm_dot_iq2_s_a8_ssse3(int n, const void *w, const void *a) {
    return dot_iq2(n, w, sizeof(block_iq2_s), a, iq2_s_prep, iq2_s_index, fm_iq2s_grid, 0);
}
