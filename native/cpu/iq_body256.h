/* The 256-bit kernels of the 3- and 1-bit i-quants (iq_lowbit.h): one weight row . na
 * (1..FM_DOTN_MAX) activation rows, each super-block's grid entries gathered once and multiplied
 * into every activation; the one-row kernels are the instances for na = 1. Included once by the
 * AVX2 and the AVX-512 file, which define before it how a sign word negates the activations and
 * how a product is scaled into the sums:
 *   SIGNS        the type of a sub-block's decoded signs
 *   SIGNS_U32(w) from a 32-bit sign word (bit v: value v negative)
 *   SIGNS_VEC(words, j) from word j of the 8 words in a vector
 *   APPLY(a, s)  the 32 activations a with the values under s negated
 *   DOT_ACC(acc, p, scale)  acc + p . scale as int32 (p: int16 products, scale: int16) */
#include "iq_simd256.h"

// ---- IQ3_XXS and IQ3_S: u the 32 unsigned grid values of sub-block j, sg its signs
#define IQ3_SUBBLOCK(u, sg, scale, j)                                                        \
    _Pragma("GCC unroll 4")                                                                 \
    for (int i = 0; i < na; i++) {                                                          \
        const __m256i p = _mm256_maddubs_epi16(u, APPLY(IQ_LOAD(IQ_ACT(i, b)->qs + 32 * (j)), sg)); \
        acc[i] = DOT_ACC(acc[i], p, scale);                                                 \
    }

// 8 int32 -> the 8 int16 scales in both 128-bit lanes, for pick (simd256.h)
IQ_INLINE __m256i iq_scales16(__m256i ls32) {
    return _mm256_broadcastsi128_si256(_mm_packs_epi32(_mm256_castsi256_si128(ls32), _mm256_extracti128_si256(ls32, 1)));
}

IQ_INLINE void iq3_xxs_n(int n, const block_iq3_xxs *x, const void *const *acts, const int na, float *out) {
    float s[FM_DOTN_MAX] = { 0 };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m256i aux = IQ_LOAD(x[b].scales_signs);
        const __m256i words = iq3xxs_sign_words(aux);
        const __m256i sc = iq_scales16(_mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(aux, 28), 1), _mm256_set1_epi32(1)));
        __m256i acc[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) acc[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 8; j++) {
            const __m256i u = IQ_GATHER8(fm_iq3xxs_grid, x[b].qs + 8 * j);
            const SIGNS sg = SIGNS_VEC(words, j);
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
        uint32_t packed;   // 8 nibbles: the scales of sub-blocks 0..7, as bytes 2s + 1
        __builtin_memcpy(&packed, x[b].scales, 4);
        const __m128i v = _mm_cvtsi32_si128((int)packed), m4 = _mm_set1_epi8(0xF);
        const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
        const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_or_si128(_mm_add_epi8(nib, nib), _mm_set1_epi8(1))));
        __m256i acc[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) acc[i] = _mm256_setzero_si256();
        uint16_t idx[64];
        iq3s_indices(x + b, idx);
        IQ_INDICES_IN_MEMORY(idx);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 8; j++) {
            const __m256i u = IQ_GATHER8(fm_iq3s_grid, idx + 8 * j);
            const SIGNS sg = SIGNS_U32(fm_iq3s_signs(x + b, j));
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
        acc[i] = DOT_ACC(acc[i], _mm256_maddubs_epi16(u, IQ_LOAD(IQ_ACT(i, b)->qs + 32 * (j))), scale);

IQ_INLINE void iq1_s_n(int n, const block_iq1_s *x, const void *const *acts, const int na, float *out) {
    float s[FM_DOTN_MAX] = { 0 };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i qh = _mm_loadu_si128((const __m128i *)x[b].qh);
        const __m128i ls = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7)), 1),
                                        _mm_set1_epi16(1));
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

// the 16 IQ1_M scales ls = 2 s + 1 (iq_lowbit.h): lo8 those of values 0..127, hi8 of 128..255
IQ_INLINE void iq1m_scales(const block_iq1_m *x, __m128i *lo8, __m128i *hi8) {
    const __m128i w = _mm_loadl_epi64((const __m128i *)x->scales);
    // each uint16 4 times, multiplied so that its field t % 4 lands in bits 13..15
    const __m128i mul = _mm_setr_epi16(8192, 1024, 128, 16, 8192, 1024, 128, 16);
    const __m128i one = _mm_set1_epi16(1);
    const __m128i w01 = _mm_shuffle_epi8(w, _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3));
    const __m128i w23 = _mm_shuffle_epi8(w, _mm_setr_epi8(4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7));
    *lo8 = _mm_or_si128(_mm_slli_epi16(_mm_srli_epi16(_mm_mullo_epi16(w01, mul), 13), 1), one);
    *hi8 = _mm_or_si128(_mm_slli_epi16(_mm_srli_epi16(_mm_mullo_epi16(w23, mul), 13), 1), one);
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

// the entry points of one ISA: fm_dot_<type>_a8_<isa> (one row) and fm_dotn_<type>_a8_<isa>
#define IQ_ENTRY_POINTS(isa)                                                                  \
    FM_DEFINE_DOTN(fm_dotn_iq3_xxs_a8_##isa, iq3_xxs_n, block_iq3_xxs)                       \
    FM_DEFINE_DOTN(fm_dotn_iq3_s_a8_##isa, iq3_s_n, block_iq3_s)                             \
    FM_DEFINE_DOTN(fm_dotn_iq1_s_a8_##isa, iq1_s_n, block_iq1_s)                             \
    FM_DEFINE_DOTN(fm_dotn_iq1_m_a8_##isa, iq1_m_n, block_iq1_m)                             \
    float fm_dot_iq3_xxs_a8_##isa(int n, const void *w, const void *a) {                     \
        float out; iq3_xxs_n(n, w, &a, 1, &out); return out; }                               \
    float fm_dot_iq3_s_a8_##isa(int n, const void *w, const void *a) {                       \
        float out; iq3_s_n(n, w, &a, 1, &out); return out; }                                 \
    float fm_dot_iq1_s_a8_##isa(int n, const void *w, const void *a) {                       \
        float out; iq1_s_n(n, w, &a, 1, &out); return out; }                                 \
    float fm_dot_iq1_m_a8_##isa(int n, const void *w, const void *a) {                       \
        float out; iq1_m_n(n, w, &a, 1, &out); return out; }

