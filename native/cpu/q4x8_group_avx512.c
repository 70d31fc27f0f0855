/* AVX-512 VNNI dot products of one group of 8 repacked rows (quants.h) with up to FM_DOTN_MAX
 * activation rows. A 512-bit register holds two pieces: 4 values of each of the 8 rows, twice;
 * one permute per register, shared by every activation, puts each row's two pieces side by
 * side, so the matching 8 activation bytes are one broadcast load, and `vpdpbusd` sums each
 * row's products straight into its own two int32 lanes. They meet at the end of the block.
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni. */
#include <immintrin.h>
#include "quants.h"
#include "simd128.h"
#include "simd256.h"

#define INLINE static inline __attribute__((always_inline))
#define LOAD512(p) _mm512_loadu_si512((const void *)(p))

// lanes 2r, 2r+1 <- lanes r, 8 + r: row r's pieces k and k+1 side by side
INLINE __m512i pieces_by_row(__m512i w) {
    return _mm512_permutexvar_epi32(_mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0), w);
}

// activation bytes a[0..3] in the even lanes, a[4..7] in the odd ones
INLINE __m512i bcast_8(const int8_t *a) {
    int64_t v;
    __builtin_memcpy(&v, a, 8);
    return _mm512_set1_epi64(v);
}

// ---- Q4_0 x8: nibbles unsigned; the offset of 8 comes off through the activation block sums.
// Pieces reordered by row (pieces_by_row) as for Q4_K below.

INLINE void q4_0x8_n(int n, const block_q4_0x8 *x, const void *const *acts, const int na, float *out) {
    const int nb = n / QK32;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    __m512 acc[FM_DOTN_MAX];
    __m256 off[FM_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) { acc[i] = _mm512_setzero_ps(); off[i] = _mm256_setzero_ps(); }
    for (int b = 0; b < nb; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m512i s[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) s[i] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2")
        for (int pp = 0; pp < 2; pp++) {   // pieces 2pp and 2pp+1
            const __m512i w = pieces_by_row(LOAD512(x[b].qs[2 * pp]));
            const __m512i lo = _mm512_and_si512(w, m4), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) {
                const int8_t *a = (const int8_t *)acts[i] + QK32 * b + 8 * pp;
                s[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s[i], lo, bcast_8(a)), hi, bcast_8(a + QK32 / 2));
            }
        }
        const __m128i d8 = _mm_loadu_si128((const __m128i *)x[b].d);
        const __m256 dw = _mm256_cvtph_ps(d8);
        const __m512 dw2 = _mm512_cvtph_ps(_mm256_set_m128i(_mm_unpackhi_epi16(d8, d8), _mm_unpacklo_epi16(d8, d8)));   // each row's twice
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i]), _mm512_mul_ps(dw2, _mm512_set1_ps(fm_a32_d(acts[i], nb)[b])), acc[i]);
            off[i] = _mm256_fmadd_ps(dw, _mm256_set1_ps(fm_a32_s(acts[i], nb)[b]), off[i]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) {
        // each row's two lanes summed into the low half of its 64-bit lane, then narrowed
        const __m512i bits = _mm512_castps_si512(acc[i]);
        const __m512 pairs = _mm512_add_ps(acc[i], _mm512_castsi512_ps(_mm512_srli_epi64(bits, 32)));
        const __m256 sum = _mm256_castsi256_ps(_mm512_cvtepi64_epi32(_mm512_castps_si512(pairs)));
        _mm256_storeu_ps(out + FM_GROUP * i, _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), off[i], sum));
    }
}

// ---- Q4_K x8: a sub-block's products in int32 by `vpdpbusd`, then times its 8 rows' scales;
// the mins through the activation sums of each 32 values, 2 sub-blocks per `vpmaddwd`. Each
// pair of pieces is reordered once (pieces_by_row) so that every activation takes its bytes by
// an 8-byte broadcast, which is a load, instead of a permute per activation.

INLINE void q4_Kx8_n(int n, const block_q4_Kx8 *x, const void *const *acts, const int na, float *out) {
    const __m512i m4 = _mm512_set1_epi8(0xF);
    float sums[FM_DOTN_MAX][FM_GROUP] __attribute__((aligned(32))) = { { 0 } };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const block_q4_Kx8 *blk = x + b;
        const block_a8_256 *y[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) y[i] = (const block_a8_256 *)acts[i] + b;
        __m128i sc8[4], mn8[4];
        q4k_scales8(blk->scales, sc8, mn8);
        __m512i si[FM_DOTN_MAX];
        __m256i mins[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            mins[i] = q4k_mins_dot8(mn8, y[i]->sums32);
            si[i] = _mm512_setzero_si512();
        }
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++) {
            __m512i w[4];
            _Pragma("GCC unroll 4")
            for (int pp = 0; pp < 4; pp++) w[pp] = pieces_by_row(LOAD512(blk->qs[j][2 * pp]));
            _Pragma("GCC unroll 2")
            for (int nib = 0; nib < 2; nib++) {   // sub-block 2j + nib
                __m512i p[FM_DOTN_MAX];
                _Pragma("GCC unroll 4")
                for (int i = 0; i < na; i++) p[i] = _mm512_setzero_si512();
                _Pragma("GCC unroll 4")
                for (int pp = 0; pp < 4; pp++) {
                    const __m512i q = _mm512_and_si512(nib ? _mm512_srli_epi16(w[pp], 4) : w[pp], m4);
                    _Pragma("GCC unroll 4")
                    for (int i = 0; i < na; i++)
                        p[i] = _mm512_dpbusd_epi32(p[i], q, bcast_8(y[i]->qs + 64 * j + 32 * nib + 8 * pp));
                }
                // the 8 rows' scales of this sub-block, each in its row's two lanes, as the int16
                // pairs [scale, 0]: a lane's 16 products stay within int16 (16 * 15 * 128 =
                // 30720), so `vpdpwssd` scales its low half and adds it on, one instruction in
                // place of `vpmulld` and an add
                const __m128i s8 = nib ? _mm_srli_si128(sc8[j], 8) : sc8[j];
                const __m512i sc = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(s8, s8));
                _Pragma("GCC unroll 4")
                for (int i = 0; i < na; i++) si[i] = _mm512_dpwssd_epi32(si[i], p[i], sc);
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->d));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->dmin));
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            // each row's two lanes summed into the low half of its 64-bit lane, then narrowed
            const __m256i rows = _mm512_cvtepi64_epi32(_mm512_add_epi32(si[i], _mm512_srli_epi64(si[i], 32)));
            q4k_accumulate8(sums[i], rows, mins[i], d, dmin, y[i]->d);
        }
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) _mm256_storeu_ps(out + FM_GROUP * i, _mm256_load_ps(sums[i]));
}

FM_DEFINE_DOTN(fm_dotg_q4_0x8_avx512, q4_0x8_n, block_q4_0x8)
FM_DEFINE_DOTN(fm_dotg_q4_Kx8_avx512, q4_Kx8_n, block_q4_Kx8)
