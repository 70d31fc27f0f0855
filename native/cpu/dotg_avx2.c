/* AVX2 dot products of one group of 8 repacked rows (quants.h) with up to FM_DOTN_MAX
 * activation rows. A 256-bit register holds 4 values of each of the 8 rows; the 4 matching
 * activation bytes are broadcast, so `vpmaddubsw` leaves each row's products in its own lanes,
 * the int16 sums of a whole block stay in one register, and one FMA scales 8 rows at once.
 * Built with -mavx2 -mfma -mf16c; the AVX-512 row of the dispatch table uses it too. */
#include <immintrin.h>
#include "quants.h"

#define INLINE static inline __attribute__((always_inline))

// Q4_0 x8: the nibbles are unsigned (0..15); the offset of 8 comes off at the end through the
// activation block sums (s = d * sum(q)). A block's 16 products per int16 lane stay below
// 16 * 15 * 127 = 30480, so the int16 sums cannot overflow.
INLINE void q4_0x8_n(int n, const block_q4_0x8 *x, const void *const *acts, const int na, float *out) {
    const int nb = n / QK32;
    const __m256i m4 = _mm256_set1_epi8(0xF), ones = _mm256_set1_epi16(1);
    __m256 acc[FM_DOTN_MAX], off[FM_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) acc[i] = off[i] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m256i s[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) s[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 4; k++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)x[b].qs[k]);
            const __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) {
                const int8_t *a = (const int8_t *)acts[i] + QK32 * b + 4 * k;
                int32_t a_lo, a_hi;
                __builtin_memcpy(&a_lo, a, 4);
                __builtin_memcpy(&a_hi, a + QK32 / 2, 4);
                s[i] = _mm256_add_epi16(s[i], _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(a_lo)),
                                                               _mm256_maddubs_epi16(hi, _mm256_set1_epi32(a_hi))));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x[b].d));
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[i], ones));
            acc[i] = _mm256_fmadd_ps(sum, _mm256_mul_ps(dw, _mm256_set1_ps(fm_a32_d(acts[i], nb)[b])), acc[i]);
            off[i] = _mm256_fmadd_ps(dw, _mm256_set1_ps(fm_a32_s(acts[i], nb)[b]), off[i]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) _mm256_storeu_ps(out + FM_GROUP * i, _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), off[i], acc[i]));
}

FM_DEFINE_DOTN(fm_dotg_q4_0x8_avx2, q4_0x8_n, block_q4_0x8)
