/* AVX2 dot products of the 3- and 1-bit i-quants (IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with up to
 * FM_DOTN_MAX 8-bit activation rows, and with one (the instances for one row): each super-block's
 * grid entries gathered once and multiplied into every activation, signs applied to the
 * activations by `psignb`, the products scaled by `pmaddwd` (iq_lowbit.h: the integers every ISA
 * sums). Built with -mavx2 -mfma -mf16c. */
#include "iq_simd256.h"

#define IQ_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define IQ_ACT(i, b) (((const block_a8_256 *)acts[i]) + (b))

// the sums of the block (acc[i]) into out[i] += block scale * sum
#define IQ_FINISH_BLOCK(dw, pow2)                                                           \
    _Pragma("GCC unroll 4")                                                                 \
    for (int i = 0; i < na; i++) s[i] += fm_iq_block_scale(dw, IQ_ACT(i, b)->d, pow2) * (float)iq_hsum_epi32(acc[i]);

// pshufb pattern that copies byte k of a broadcast 32-bit word to bytes 8k..8k+7, and the bit
// that each byte then tests
static const uint8_t IQ_SIGN_SPREAD[32] __attribute__((aligned(32))) = {
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3 };
static const uint8_t IQ_SIGN_BITS[32] __attribute__((aligned(32))) = {
    1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128 };

// a broadcast sign word's bits as bytes: byte v of the result holds bit v of the word at bit
// position v % 8, its other bits zero
IQ_INLINE __m256i iq_spread_signs(__m256i word) {
    return _mm256_and_si256(_mm256_shuffle_epi8(word, _mm256_load_si256((const __m256i *)IQ_SIGN_SPREAD)),
                            _mm256_load_si256((const __m256i *)IQ_SIGN_BITS));
}

IQ_INLINE int32_t iq_hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// the `psignb` operand of a broadcast sign word: each byte's bit + 0x7F, negative (0x80..0xFF)
// where the value is negative, else 0x7F; an add where a compare and an or took two
IQ_INLINE __m256i sign_operand(__m256i word) {
    return _mm256_add_epi8(iq_spread_signs(word), _mm256_set1_epi8(0x7F));
}

// ---- IQ3_XXS and IQ3_S: u the 32 unsigned grid values of sub-block j, sg its signs
#define IQ3_SUBBLOCK(u, sg, scale, j)                                                        \
    _Pragma("GCC unroll 4")                                                                 \
    for (int i = 0; i < na; i++) {                                                          \
        const __m256i p = _mm256_maddubs_epi16(u, _mm256_sign_epi8(IQ_LOAD(IQ_ACT(i, b)->qs + 32 * (j)), sg)); \
        acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(p, scale));                     \
    }

IQ_INLINE void iq3_xxs_n(int n, const block_iq3_xxs *x, const void *const *acts, const int na, float *out) {
    float s[FM_DOTN_MAX] = { 0 };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m256i aux = IQ_LOAD(x[b].scales_signs);
        const __m256i words = iq3xxs_sign_words(aux);
        const __m256i sc = _mm256_broadcastsi128_si256(iq3xxs_scales(aux));
        __m256i acc[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) acc[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 8; j++) {
            const __m256i u = IQ_GATHER8(fm_iq3xxs_grid, x[b].qs + 8 * j);
            const __m256i sg = sign_operand(_mm256_permutevar8x32_epi32(words, _mm256_set1_epi32(j)));
            const __m256i scale = pick(sc, j);
            IQ3_SUBBLOCK(u, sg, scale, j)
        }
        IQ_FINISH_BLOCK(_cvtsh_ss(x[b].d), FM_IQ3XXS_POW2)
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = s[i];
}

IQ_INLINE void iq3_s_n(int n, const block_iq3_s *x, const void *const *acts, const int na, float *out) {
    float s[FM_DOTN_MAX] = { 0 };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m256i sc = _mm256_broadcastsi128_si256(iq3s_scales(x + b));
        __m256i acc[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) acc[i] = _mm256_setzero_si256();
        uint16_t idx[64];
        iq3s_indices(x + b, idx);
        IQ_INDICES_IN_MEMORY(idx);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 8; j++) {
            const __m256i u = IQ_GATHER8(fm_iq3s_grid, idx + 8 * j);
            const __m256i sg = sign_operand(_mm256_set1_epi32((int)fm_iq3s_signs(x + b, j)));
            const __m256i scale = pick(sc, j);
            IQ3_SUBBLOCK(u, sg, scale, j)
        }
        IQ_FINISH_BLOCK(_cvtsh_ss(x[b].d), FM_IQ3S_POW2)
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = s[i];
}

// ---- IQ1_S and IQ1_M: u the 32 bytes of fm_iq1_grid8 of sub-block j (no signs)
#define IQ1_SUBBLOCK(u, scale, j)                                                            \
    _Pragma("GCC unroll 4")                                                                 \
    for (int i = 0; i < na; i++)                                                            \
        acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, IQ_LOAD(IQ_ACT(i, b)->qs + 32 * (j))), scale));

IQ_INLINE void iq1_s_n(int n, const block_iq1_s *x, const void *const *acts, const int na, float *out) {
    float s[FM_DOTN_MAX] = { 0 };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i ls = iq1s_scales(x + b);
        const __m256i sc = _mm256_broadcastsi128_si256(ls);
        __m256i acc[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {   // minus 16 ls . (the sums of each 32 activations), iq_lowbit.h
            const __m128i c = _mm_madd_epi16(ls, _mm_load_si128((const __m128i *)IQ_ACT(i, b)->sums32));
            acc[i] = _mm256_set_m128i(_mm_setzero_si128(), _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(c, 4)));
        }
        uint16_t idx[32];
        iq1s_indices(x + b, idx);
        IQ_INDICES_IN_MEMORY(idx);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 8; j++) {
            const __m256i u = IQ_GATHER4(fm_iq1_grid8, idx + 4 * j);
            const __m256i scale = pick(sc, j);
            IQ1_SUBBLOCK(u, scale, j)
        }
        IQ_FINISH_BLOCK(_cvtsh_ss(x[b].d), FM_IQ1_POW2)
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = s[i];
}

IQ_INLINE void iq1_m_n(int n, const block_iq1_m *x, const void *const *acts, const int na, float *out) {
    float s[FM_DOTN_MAX] = { 0 };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m128i lo8, hi8;
        iq1m_scales(x + b, &lo8, &hi8);
        const __m256i ls16 = _mm256_set_m128i(hi8, lo8);
        __m256i acc[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {   // minus 16 ls . (the sums of each 16 activations), iq_lowbit.h
            const __m256i c = _mm256_madd_epi16(ls16, IQ_LOAD(IQ_ACT(i, b)->bsums));
            acc[i] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(c, 4));
        }
        const __m256i sclo = _mm256_broadcastsi128_si256(lo8), schi = _mm256_broadcastsi128_si256(hi8);
        uint16_t idx[32];
        iq1m_indices(x + b, idx);
        IQ_INDICES_IN_MEMORY(idx);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 8; j++) {
            const __m256i u = IQ_GATHER4(fm_iq1_grid8, idx + 4 * j);
            const __m256i scale = pick(j < 4 ? sclo : schi, 8 + j % 4);
            IQ1_SUBBLOCK(u, scale, j)
        }
        IQ_FINISH_BLOCK(_cvtsh_ss(fm_iq1m_d(x + b)), FM_IQ1_POW2)
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = s[i];
}

IQ_KERNELS(iq3_xxs, avx2)
IQ_KERNELS(iq3_s, avx2)
IQ_KERNELS(iq1_s, avx2)
IQ_KERNELS(iq1_m, avx2)
