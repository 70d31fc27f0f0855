/* SSSE3 dot products of one group of 8 repacked rows (quants.h) with up to FM_DOTN_MAX
 * activation rows. A 128-bit register holds 4 values of each of 4 rows, so each group is two
 * halves (rows 0..3, then 4..7) read from the same runs; the 4 matching activation bytes are
 * broadcast, `pmaddubsw` leaves each row's products in its own lanes, and the int16 sums are
 * scaled for 4 rows at once. Cache-resident they are level with the GGUF-layout kernels or
 * ahead, but streaming a whole model they lose (the broadcasts cost a shuffle each in 128 bits;
 * docs/performance.md), so the engine repacks only for AVX2 and AVX-512
 * (native/cpu_repack.py). Built with -mssse3 only; must hold no AVX instruction. */
#include <tmmintrin.h>
#include "quants.h"
#include "simd128.h"

#define INLINE static inline __attribute__((always_inline))
#define HALF 4   // rows per 128-bit register

// 16 bytes at a 32-byte run of 8 rows x 4 bytes: rows 4*half..4*half+3
#define RUN(p, half) _mm_loadu_si128((const __m128i *)((const uint8_t *)(p) + 16 * (half)))

INLINE __m128i bcast4(const int8_t *a) {
    int32_t v;
    __builtin_memcpy(&v, a, 4);
    return _mm_set1_epi32(v);
}

// 4 f16 scales -> floats (no F16C here)
INLINE __m128 scales4(const fm_f16 *d) {
    return _mm_setr_ps(fm_half(d[0]), fm_half(d[1]), fm_half(d[2]), fm_half(d[3]));
}

// ---- Q4_0 x8: nibbles unsigned, the offset of 8 through the activation block sums; a block's
// 16 products per int16 lane stay below 16 * 15 * 127 = 30480

INLINE void q4_0x8_half(int n, const block_q4_0x8 *x, const void *const *acts, const int na, float *out, int half) {
    const int nb = n / QK32;
    const __m128i m4 = _mm_set1_epi8(0xF), ones = _mm_set1_epi16(1);
    __m128 acc[FM_DOTN_MAX], off[FM_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) acc[i] = off[i] = _mm_setzero_ps();
    for (int b = 0; b < nb; b++) {
        if (half == 0) fm_prefetch_ahead(x + b, sizeof *x);
        __m128i s[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) s[i] = _mm_setzero_si128();
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 4; k++) {
            const __m128i w = RUN(x[b].qs[k], half);
            const __m128i lo = _mm_and_si128(w, m4), hi = _mm_and_si128(_mm_srli_epi16(w, 4), m4);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) {
                const int8_t *a = (const int8_t *)acts[i] + QK32 * b + 4 * k;
                s[i] = _mm_add_epi16(s[i], _mm_add_epi16(_mm_maddubs_epi16(lo, bcast4(a)),
                                                         _mm_maddubs_epi16(hi, bcast4(a + QK32 / 2))));
            }
        }
        const __m128 dw = scales4(x[b].d + HALF * half);
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            const __m128 sum = _mm_cvtepi32_ps(_mm_madd_epi16(s[i], ones));
            acc[i] = _mm_add_ps(acc[i], _mm_mul_ps(sum, _mm_mul_ps(dw, _mm_set1_ps(fm_a32_d(acts[i], nb)[b]))));
            off[i] = _mm_add_ps(off[i], _mm_mul_ps(dw, _mm_set1_ps(fm_a32_s(acts[i], nb)[b])));
        }
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++)
        _mm_storeu_ps(out + FM_GROUP * i + HALF * half, _mm_sub_ps(acc[i], _mm_mul_ps(_mm_set1_ps(8.0f), off[i])));
}

// ---- Q4_K x8: the 8 rows' scales and mins unpack together from the byte planes
// (q4k_scales8, simd128.h); each half takes its 4 rows' bytes. A sub-block's 8 pieces add up as
// int16 (below 16 * 15 * 127 = 30480 per lane) before `pmaddwd` applies the scales.

// bytes at..at+3 of v as int16, each twice: [b0 b0 b1 b1 b2 b2 b3 b3]
#define ROWS4_X2(v, at) \
    _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_srli_si128(v, at), _mm_setzero_si128()), \
                       _mm_unpacklo_epi8(_mm_srli_si128(v, at), _mm_setzero_si128()))

INLINE void q4_Kx8_half(int n, const block_q4_Kx8 *x, const void *const *acts, const int na, float *out, int half) {
    const __m128i m4 = _mm_set1_epi8(0xF), zero = _mm_setzero_si128();
    float sums[FM_DOTN_MAX][HALF] __attribute__((aligned(16))) = { { 0 } };
    for (int b = 0; b < n / QK_K; b++) {
        if (half == 0) fm_prefetch_ahead(x + b, sizeof *x);
        const block_q4_Kx8 *blk = x + b;
        const block_a8_256 *y[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) y[i] = (const block_a8_256 *)acts[i] + b;
        __m128i sc8[4], mn8[4];
        q4k_scales8(blk->scales, sc8, mn8);
        __m128i si[FM_DOTN_MAX], mins[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) si[i] = mins[i] = _mm_setzero_si128();
        _Pragma("GCC unroll 4")
        for (int t = 0; t < 4; t++) {   // [m_r(2t), m_r(2t+1)] of the 4 rows . (bsum 2t, bsum 2t+1)
            const __m128i mp = _mm_unpacklo_epi8(_mm_unpacklo_epi8(_mm_srli_si128(mn8[t], HALF * half),
                                                                   _mm_srli_si128(mn8[t], 8 + HALF * half)), zero);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) mins[i] = _mm_add_epi32(mins[i], _mm_madd_epi16(mp, _mm_set1_epi32(a8_sums32_pair(y[i]->sums32, t))));
        }
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++)
            _Pragma("GCC unroll 2")
            for (int nib = 0; nib < 2; nib++) {   // sub-block 2j + nib
                __m128i p[FM_DOTN_MAX];
                _Pragma("GCC unroll 4")
                for (int i = 0; i < na; i++) p[i] = _mm_setzero_si128();
                _Pragma("GCC unroll 8")
                for (int k = 0; k < 8; k++) {
                    const __m128i w = RUN(blk->qs[j][k], half);
                    const __m128i q = _mm_and_si128(nib ? _mm_srli_epi16(w, 4) : w, m4);
                    _Pragma("GCC unroll 4")
                    for (int i = 0; i < na; i++)
                        p[i] = _mm_add_epi16(p[i], _mm_maddubs_epi16(q, bcast4(y[i]->qs + 64 * j + 32 * nib + 4 * k)));
                }
                const __m128i sc = ROWS4_X2(sc8[j], 8 * nib + HALF * half);
                _Pragma("GCC unroll 4")
                for (int i = 0; i < na; i++) si[i] = _mm_add_epi32(si[i], _mm_madd_epi16(p[i], sc));
            }
        const __m128 d = scales4(blk->d + HALF * half), dmin = scales4(blk->dmin + HALF * half);
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            const __m128 da = _mm_set1_ps(y[i]->d);
            const __m128 v = _mm_sub_ps(_mm_mul_ps(_mm_cvtepi32_ps(si[i]), _mm_mul_ps(d, da)),
                                        _mm_mul_ps(_mm_cvtepi32_ps(mins[i]), _mm_mul_ps(dmin, da)));
            _mm_store_ps(sums[i], _mm_add_ps(_mm_load_ps(sums[i]), v));
        }
        __asm__ volatile("" ::: "memory");   // keep the sums in memory, out of the register budget
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) _mm_storeu_ps(out + FM_GROUP * i + HALF * half, _mm_load_ps(sums[i]));
}

// both halves of the group, each an instance with na a constant (inlined into each case of
// FM_DEFINE_DOTN: a called helper left na a variable, and one activation ran slower)
#define FM_DEFINE_DOTG_HALVES(name, half_fn, block_t)                                        \
    INLINE void half_fn##_both(int n, const block_t *x, const void *const *acts, const int na, float *out) { \
        half_fn(n, x, acts, na, out, 0);                                                     \
        half_fn(n, x, acts, na, out, 1);                                                     \
    }                                                                                        \
    FM_DEFINE_DOTN(name, half_fn##_both, block_t)

FM_DEFINE_DOTG_HALVES(fm_dotg_q4_0x8_ssse3, q4_0x8_half, block_q4_0x8)
FM_DEFINE_DOTG_HALVES(fm_dotg_q4_Kx8_ssse3, q4_Kx8_half, block_q4_Kx8)
