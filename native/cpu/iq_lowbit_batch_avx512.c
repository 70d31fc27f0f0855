/* AVX-512 dot products of the 3- and 1-bit i-quants (IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with up to
 * FM_DOTN_MAX 8-bit activation rows, and with one (the instances for one row): the arithmetic of
 * the AVX2 kernels (iq_lowbit_batch_avx2.c) on two sub-blocks (64 values) per 512-bit register. The signs
 * of both negate the activations as one 64-bit mask (one masked subtraction), and `vpdpwssd`
 * scales and adds each product in one instruction. Built with the AVX-512 F/BW/VL/VNNI flags. */
#include "iq_simd512.h"

// pshufb pattern QUAD[h] over 8 int16 scales broadcast to the 4 lanes: lanes 4h..4h+3 one per lane
static const uint8_t QUAD[2][64] __attribute__((aligned(64))) = {
    { IQ_LANE_OF(0), IQ_LANE_OF(1), IQ_LANE_OF(2), IQ_LANE_OF(3) }, { IQ_LANE_OF(4), IQ_LANE_OF(5), IQ_LANE_OF(6), IQ_LANE_OF(7) } };

INLINE void iq3_xxs_n(int n, const block_iq3_xxs *x, const void *const *acts, const int na, float *out) {
    float s[FM_DOTN_MAX] = { 0 };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m256i aux = _mm256_loadu_si256((const __m256i *)x[b].scales_signs);
        uint64_t words[4];   // the sign words of sub-blocks 2k, 2k+1 as one mask each
        _mm256_storeu_si256((__m256i *)words, iq3xxs_sign_words(aux));
        const __m128i sc = iq3xxs_scales(aux);
        ZERO_ACC()
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 4; k++) {
            const uint8_t *q = x[b].qs + 16 * k;
            const __m512i u = join(IQ_GATHER8(fm_iq3xxs_grid, q), IQ_GATHER8(fm_iq3xxs_grid, q + 8));
            PAIR_DOT(u, _cvtu64_mask64(words[k]), pick512(sc, PAIR[k]), k)
        }
        FINISH_BLOCK(_cvtsh_ss(x[b].d), FM_IQ3XXS_POW2)
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = s[i];
}

INLINE void iq3_s_n(int n, const block_iq3_s *x, const void *const *acts, const int na, float *out) {
    float s[FM_DOTN_MAX] = { 0 };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i sc = iq3s_scales(x + b);
        uint16_t idx[64];
        iq3s_indices(x + b, idx);
        IQ_INDICES_IN_MEMORY(idx);
        ZERO_ACC()
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 4; k++) {
            const __m512i u = join(IQ_GATHER8(fm_iq3s_grid, idx + 16 * k), IQ_GATHER8(fm_iq3s_grid, idx + 16 * k + 8));
            PAIR_DOT(u, _cvtu64_mask64(load64(x[b].signs + 8 * k)), pick512(sc, PAIR[k]), k)
        }
        FINISH_BLOCK(_cvtsh_ss(x[b].d), FM_IQ3S_POW2)
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = s[i];
}

INLINE void iq1_s_n(int n, const block_iq1_s *x, const void *const *acts, const int na, float *out) {
    float s[FM_DOTN_MAX] = { 0 };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i ls = iq1s_scales(x + b);
        uint16_t idx[32];
        iq1s_indices(x + b, idx);
        IQ_INDICES_IN_MEMORY(idx);
        __m512i acc[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {   // minus 16 ls . (the sums of each 32 activations), iq_lowbit.h
            const __m128i c = _mm_madd_epi16(ls, _mm_load_si128((const __m128i *)ACT(i, b)->sums32));
            acc[i] = _mm512_zextsi128_si512(_mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(c, 4)));
        }
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 4; k++) {
            const __m512i u = join(IQ_GATHER4(fm_iq1_grid8, idx + 8 * k), IQ_GATHER4(fm_iq1_grid8, idx + 8 * k + 4));
            PAIR_DOT_UNSIGNED(u, pick512(ls, PAIR[k]), k)
        }
        FINISH_BLOCK(_cvtsh_ss(x[b].d), FM_IQ1_POW2)
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = s[i];
}

INLINE void iq1_m_n(int n, const block_iq1_m *x, const void *const *acts, const int na, float *out) {
    float s[FM_DOTN_MAX] = { 0 };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m128i lo8, hi8;
        iq1m_scales(x + b, &lo8, &hi8);
        const __m256i ls16 = _mm256_set_m128i(hi8, lo8);
        uint16_t idx[32];
        iq1m_indices(x + b, idx);
        IQ_INDICES_IN_MEMORY(idx);
        __m512i acc[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {   // minus 16 ls . (the sums of each 16 activations), iq_lowbit.h
            const __m256i c = _mm256_madd_epi16(ls16, _mm256_loadu_si256((const __m256i *)ACT(i, b)->bsums));
            acc[i] = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(c, 4)));
        }
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 4; k++) {   // values 64k..: the scales 4k..4k+3, one per 128-bit lane
            const __m512i u = join(IQ_GATHER4(fm_iq1_grid8, idx + 8 * k), IQ_GATHER4(fm_iq1_grid8, idx + 8 * k + 4));
            PAIR_DOT_UNSIGNED(u, pick512(k < 2 ? lo8 : hi8, QUAD[k % 2]), k)
        }
        FINISH_BLOCK(_cvtsh_ss(fm_iq1m_d(x + b)), FM_IQ1_POW2)
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = s[i];
}

IQ_KERNELS(iq3_xxs, avx512)
IQ_KERNELS(iq3_s, avx512)
IQ_KERNELS(iq1_s, avx512)
IQ_KERNELS(iq1_m, avx512)
