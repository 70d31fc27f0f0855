/* AVX2 dot products of the 2-bit i-quants (IQ2_XXS, IQ2_XS, IQ2_S) with up to FM_DOTN_MAX
 * activation rows (batched decode), and the one-row kernels as its instance for one row. Per
 * block, iq2_prep.h unpacks the indices, signs and scales; per sub-block of 32 values, four grid
 * entries are gathered as 64-bit words and the sign mask is expanded once, then each activation
 * is signed (`psignb`), multiplied by `pmaddubsw` with the unsigned grid values and scaled by
 * `pmaddwd`. Built with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include "iq2_prep.h"
#include "simd256.h"

#define INLINE static inline __attribute__((always_inline))

// entries k..k+3 (32 values) of a block
INLINE __m256i grid4(const uint64_t *grid, iq2_index_fn index, const uint8_t *x, const iq2_prep *p, int k) {
    const __m128i lo = _mm_set_epi64x((long long)grid[index(x, p, k + 1)], (long long)grid[index(x, p, k)]);
    const __m128i hi = _mm_set_epi64x((long long)grid[index(x, p, k + 3)], (long long)grid[index(x, p, k + 2)]);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

// the sign bytes of sub-block ib, each spread over 8 bytes, as `psignb` operands: negative
// (0x80..0xFF) where the value is negative, else 0x7F. One `pshufb` from the 16 sign bytes of
// its half of the block in both 128-bit lanes; then (byte & bit) + 0x7F sets the top bit with the
// bit, which `psignb` reads, where a compare and a conditional negation took one more operation
INLINE __m256i sign_of(__m256i signs16, int ib) {
    const char b = (char)(4 * (ib % 4));
    const __m256i spread = _mm256_setr_epi8(b, b, b, b, b, b, b, b, b + 1, b + 1, b + 1, b + 1, b + 1, b + 1, b + 1, b + 1,
                                            b + 2, b + 2, b + 2, b + 2, b + 2, b + 2, b + 2, b + 2,
                                            b + 3, b + 3, b + 3, b + 3, b + 3, b + 3, b + 3, b + 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
    return _mm256_add_epi8(_mm256_and_si256(_mm256_shuffle_epi8(signs16, spread), bit), _mm256_set1_epi8(0x7F));
}

INLINE void iq2_n(int n, const uint8_t *x, size_t block_bytes, iq2_prep_fn prep, iq2_index_fn index, const uint64_t *grid,
                  const void *const *acts, const int na, float *out) {
    __m256 acc[FM_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) acc[i] = _mm256_setzero_ps();
    for (int b = 0; b < n / QK_K; b++, x += block_bytes) {
        fm_prefetch_ahead(x, block_bytes);
        iq2_prep p;
        prep(x, &p);
        const __m256i sc = _mm256_inserti128_si256(_mm256_castsi128_si256(p.lo), p.hi, 1);
        __m256i si[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) si[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 8")
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const __m256i signs16 = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(p.signs + 16 * (ib / 4))));
            const __m256i g = grid4(grid, index, x, &p, 4 * ib), sg = sign_of(signs16, ib);
            const __m256i scale = pick(sc, ib);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(((const block_a8_256 *)acts[i])[b].qs + 32 * ib));
                const __m256i sv = _mm256_sign_epi8(v, sg);
                si[i] = _mm256_add_epi32(si[i], _mm256_madd_epi16(_mm256_maddubs_epi16(g, sv), scale));
            }
        }
        const float d = _cvtsh_ss(iq2_d(x)) * 0.125f;
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++)
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si[i]), _mm256_set1_ps(d * ((const block_a8_256 *)acts[i])[b].d),
                                     acc[i]);
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = hsum256_ps(acc[i]);
}

#define IQ2_KERNELS(name, block_t, prep, index, grid)                                                     \
    INLINE void name##_n(int n, const uint8_t *x, const void *const *acts, const int na, float *out) { \
        iq2_n(n, x, sizeof(block_t), prep, index, grid, acts, na, out);                                  \
    }                                                                                              \
    FM_DEFINE_DOT1(fm_dot_##name##_a8_avx2, name##_n, uint8_t)                                     \
    FM_DEFINE_DOTN(fm_dotn_##name##_a8_avx2, name##_n, uint8_t)

IQ2_KERNELS(iq2_xxs, block_iq2_xxs, iq2_xxs_prep, iq2_xxs_index, fm_iq2xxs_grid)
IQ2_KERNELS(iq2_xs, block_iq2_xs, iq2_xs_prep, iq2_xs_index, fm_iq2xs_grid)
IQ2_KERNELS(iq2_s, block_iq2_s, iq2_s_prep, iq2_s_index, fm_iq2s_grid)
