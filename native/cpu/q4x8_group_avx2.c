/* AVX2 dot products of one group of 8 repacked rows (quants.h) with up to FM_DOTN_MAX
 * activation rows. A 256-bit register holds 4 values of each of the 8 rows; the 4 matching
 * activation bytes are broadcast, so `vpmaddubsw` leaves each row's products in its own lanes,
 * the int16 sums of a whole block stay in one register, and one FMA scales 8 rows at once.
 * Built with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include "quants.h"
#include "simd128.h"
#include "simd256.h"

#define INLINE static inline __attribute__((always_inline))
#define LOAD(p) _mm256_loadu_si256((const __m256i *)(p))

// 4 activation bytes in every 32-bit lane: `vbroadcastss` from memory is a load alone, where
// _mm256_set1_epi32 of an int costs a move and a shuffle
INLINE __m256i bcast4(const int8_t *a) {
    return _mm256_castps_si256(_mm256_broadcast_ss((const float *)(const void *)a));
}

// Q4_0 x8: the nibbles are unsigned (0..15); the offset of 8 comes off each block through the
// activation block sums (s = d * sum(q)). A block's 16 products per int16 lane stay below
// 16 * 15 * 127 = 30480, so the int16 sums cannot overflow. Each activation's int16 sum is one
// chain (not a tree of temporaries) and its float sum one register, so that 4 activations fit
// in the 16 registers without spilling.
INLINE void q4_0x8_n(int n, const block_q4_0x8 *x, const void *const *acts, const int na, float *out) {
    const int nb = n / QK32;
    const __m256i m4 = _mm256_set1_epi8(0xF), ones = _mm256_set1_epi16(1);
    const int8_t *q[FM_DOTN_MAX];
    __m256 acc[FM_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) {
        q[i] = acts[i];
        acc[i] = _mm256_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m256i s[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) s[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 4; k++) {
            const __m256i w = LOAD(x[b].qs[k]);
            const __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) {
                const int8_t *a = q[i] + QK32 * b + 4 * k;
                s[i] = _mm256_add_epi16(s[i], _mm256_maddubs_epi16(lo, bcast4(a)));
                s[i] = _mm256_add_epi16(s[i], _mm256_maddubs_epi16(hi, bcast4(a + QK32 / 2)));
                __asm__("" : "+x"(s[i]));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x[b].d));
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[i], ones));
            const __m256 v = _mm256_fmsub_ps(sum, _mm256_set1_ps(fm_a32_d(q[i], nb)[b]),
                                             _mm256_set1_ps(8.0f * fm_a32_s(q[i], nb)[b]));
            acc[i] = _mm256_fmadd_ps(dw, v, acc[i]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) _mm256_storeu_ps(out + FM_GROUP * i, acc[i]);
}

// Q4_K x8: the 6-bit scales and mins of 8 rows are unpacked together, from the byte planes of
// the packed scales (q4k_scales8, simd128.h). A sub-block's 8 pieces add up as int16 (below
// 16 * 15 * 127 = 30480 per lane) before `vpmaddwd` applies its 8 rows' scales; the mins go
// through the activation sums of each 32 values, 2 sub-blocks per `vpmaddwd`.

INLINE void q4_Kx8_n(int n, const block_q4_Kx8 *x, const void *const *acts, const int na, float *out) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    float sums[FM_DOTN_MAX][FM_GROUP] __attribute__((aligned(32))) = { { 0 } };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const block_q4_Kx8 *blk = x + b;
        const block_a8_256 *y[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) y[i] = (const block_a8_256 *)acts[i] + b;
        __m128i sc8[4], mn8[4];
        q4k_scales8(blk->scales, sc8, mn8);
        __m256i si[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) si[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 1")   // unrolled, the accumulators of 4 activations spill
        for (int j = 0; j < 4; j++)
            _Pragma("GCC unroll 2")
            for (int nib = 0; nib < 2; nib++) {   // sub-block 2j + nib: the low or high nibbles of chunk j
                const __m128i s8 = nib ? _mm_unpackhi_epi8(sc8[j], sc8[j]) : _mm_unpacklo_epi8(sc8[j], sc8[j]);
                __m256i p[FM_DOTN_MAX];
                _Pragma("GCC unroll 4")
                for (int i = 0; i < na; i++) p[i] = _mm256_setzero_si256();
#define Q4K_PIECE(k)                                                                                  \
                {                                                                                             \
                    const __m256i w = LOAD(blk->qs[j][k]);                                                    \
                    const __m256i q = _mm256_and_si256(nib ? _mm256_srli_epi16(w, 4) : w, m4);               \
                    _Pragma("GCC unroll 4")                                                                   \
                    for (int i = 0; i < na; i++)                                                              \
                    {                                                                                         \
                        p[i] = _mm256_add_epi16(p[i], _mm256_maddubs_epi16(q, bcast4(y[i]->qs + 64 * j + 32 * nib + 4 * k))); \
                        __asm__("" : "+x"(p[i]));                                                             \
                    }                                                                                         \
                }
                if (na == 1) {   // all 8 pieces unrolled: one activation's accumulators fit
                    _Pragma("GCC unroll 8")
                    for (int k = 0; k < 8; k++) Q4K_PIECE(k)
                } else {         // 4 at a time: all 8 spill the accumulators of 4 activations
                    _Pragma("GCC unroll 4")
                    for (int k = 0; k < 8; k++) Q4K_PIECE(k)
                }
#undef Q4K_PIECE
                const __m256i sc = _mm256_cvtepu8_epi16(s8);
                _Pragma("GCC unroll 4")
                for (int i = 0; i < na; i++) si[i] = _mm256_add_epi32(si[i], _mm256_madd_epi16(p[i], sc));
            }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->d));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->dmin));
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++)   // the mins last: held through the loop, they took 4 registers
            q4k_accumulate8(sums[i], si[i], q4k_mins_dot8(mn8, y[i]->sums32), d, dmin, y[i]->d);
        __asm__ volatile("" ::: "memory");   // keep the sums in memory, out of the register budget
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) _mm256_storeu_ps(out + FM_GROUP * i, _mm256_load_ps(sums[i]));
}

FM_DEFINE_DOTN(fm_dotg_q4_0x8_avx2, q4_0x8_n, block_q4_0x8)
FM_DEFINE_DOTN(fm_dotg_q4_Kx8_avx2, q4_Kx8_n, block_q4_Kx8)
