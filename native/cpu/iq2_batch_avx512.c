/* AVX-512 (VNNI) dot products of the 2-bit i-quants (IQ2_XXS, IQ2_XS, IQ2_S) with up to
 * FM_DOTN_MAX activation rows, and the one-row kernels as its instance for one row. Per block,
 * iq2_prep.h unpacks the indices, signs and scales; per two sub-blocks (64 values), eight grid
 * entries are gathered as 64-bit words, and the block's sign bytes, read as one 64-bit mask, negate
 * the activations under a mask (`vpsubb` from zero), then `pmaddubsw` with the unsigned grid
 * values and `vpdpwssd` with the scales. Built with the AVX-512 F/BW/VL/VNNI flags. */
#include <immintrin.h>
#include <string.h>
#include "iq2_prep.h"
#include "simd512.h"

#define INLINE static inline __attribute__((always_inline))

// entries 8 p .. 8 p + 7 (64 values) of a block
INLINE __m512i grid8(const uint64_t *grid, iq2_index_fn index, const uint8_t *x, const iq2_prep *p, int k) {
    const __m128i e0 = _mm_set_epi64x((long long)grid[index(x, p, k + 1)], (long long)grid[index(x, p, k + 0)]);
    const __m128i e1 = _mm_set_epi64x((long long)grid[index(x, p, k + 3)], (long long)grid[index(x, p, k + 2)]);
    const __m128i e2 = _mm_set_epi64x((long long)grid[index(x, p, k + 5)], (long long)grid[index(x, p, k + 4)]);
    const __m128i e3 = _mm_set_epi64x((long long)grid[index(x, p, k + 7)], (long long)grid[index(x, p, k + 6)]);
    return join(_mm256_inserti128_si256(_mm256_castsi128_si256(e0), e1, 1),
                _mm256_inserti128_si256(_mm256_castsi128_si256(e2), e3, 1));
}

INLINE void iq2_n(int n, const uint8_t *x, size_t block_bytes, iq2_prep_fn prep, iq2_index_fn index, const uint64_t *grid,
                  const void *const *acts, const int na, float *out) {
    __m512 acc[FM_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) acc[i] = _mm512_setzero_ps();
    for (int b = 0; b < n / QK_K; b++, x += block_bytes) {
        fm_prefetch_ahead(x, block_bytes);
        iq2_prep p;
        prep(x, &p);
        // lanes: lo scales, hi scales, lo, hi: PATTERNS512 row q gives sub-block 2q's to the first
        // two 128-bit lanes and 2q + 1's to the last two
        const __m512i sc = _mm512_broadcast_i64x4(_mm256_inserti128_si256(_mm256_castsi128_si256(p.lo), p.hi, 1));
        __m512i si[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) si[i] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4")
        for (int q = 0; q < QK_K / 64; q++) {
            const __m512i g = grid8(grid, index, x, &p, 8 * q), scale = pick512(sc, q);
            uint64_t bits;
            memcpy(&bits, p.signs + 8 * q, sizeof bits);   // bit j: value 64 q + j is negative
            const __mmask64 neg = _cvtu64_mask64(bits);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) {
                const __m512i v = _mm512_loadu_si512((const void *)(((const block_a8_256 *)acts[i])[b].qs + 64 * q));
                const __m512i sv = _mm512_mask_sub_epi8(v, neg, _mm512_setzero_si512(), v);
                si[i] = _mm512_dpwssd_epi32(si[i], _mm512_maddubs_epi16(g, sv), scale);
            }
        }
        const float d = _cvtsh_ss(iq2_d(x)) * 0.125f;
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++)
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si[i]), _mm512_set1_ps(d * ((const block_a8_256 *)acts[i])[b].d),
                                     acc[i]);
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = _mm512_reduce_add_ps(acc[i]);
}

#define IQ2_KERNELS(name, block_t, prep, index, grid)                                                     \
    INLINE void name##_n(int n, const uint8_t *x, const void *const *acts, const int na, float *out) { \
        iq2_n(n, x, sizeof(block_t), prep, index, grid, acts, na, out);                                  \
    }                                                                                              \
    FM_DEFINE_DOT1(fm_dot_##name##_a8_avx512, name##_n, uint8_t)                                   \
    FM_DEFINE_DOTN(fm_dotn_##name##_a8_avx512, name##_n, uint8_t)

IQ2_KERNELS(iq2_xxs, block_iq2_xxs, iq2_xxs_prep, iq2_xxs_index, fm_iq2xxs_grid)
IQ2_KERNELS(iq2_xs, block_iq2_xs, iq2_xs_prep, iq2_xs_index, fm_iq2xs_grid)
IQ2_KERNELS(iq2_s, block_iq2_s, iq2_s_prep, iq2_s_index, fm_iq2s_grid)
