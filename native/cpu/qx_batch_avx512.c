/* AVX-512 VNNI dot products of one weight row with up to FM_DOTN_MAX activation rows (batched
 * decode): each 64-quant step is unpacked once and multiplied into every activation by
 * `vpdpbusd` (Q4_0) or `vpmaddubsw` + `vpdpwssd` (K-quants). The 32 zmm registers hold every
 * accumulator. Built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni. */
#include <immintrin.h>
#include "quants.h"
#include "simd256.h"
#include "simd512.h"

#define INLINE static inline __attribute__((always_inline))
#define ACT(i) ((const block_a8_256 *)acts[i])

INLINE void q4_0_n(int n, const block_q4_0 *x, const void *const *acts, const int na, float *out) {
    const int nb = n / QK32;
    __m512 acc[FM_DOTN_MAX];
    __m256 off[FM_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) { acc[i] = _mm512_setzero_ps(); off[i] = _mm256_setzero_ps(); }
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        fm_prefetch_ahead(x + b, 8 * sizeof *x);
        const __m256 dw = scales8((const uint8_t *)&x[b].d, sizeof(block_q4_0));
        __m512 dd[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            dd[i] = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_loadu_ps(fm_a32_d(acts[i], nb) + b)));
            off[i] = _mm256_fmadd_ps(dw, _mm256_loadu_ps(fm_a32_s(acts[i], nb) + b), off[i]);
        }
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 8; k += 2) {
            const __m512i u = join(q4_nibbles(x[b + k].qs), q4_nibbles(x[b + k + 1].qs));
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) {
                const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,
                                                      _mm512_loadu_si512((const void *)((const int8_t *)acts[i] + QK32 * (b + k))));
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), lane_pair(dd[i], k), acc[i]);
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) {
        float s = _mm512_reduce_add_ps(acc[i]) - 8.0f * hsum256_ps(off[i]);
        const float *dy = fm_a32_d(acts[i], nb), *sy = fm_a32_s(acts[i], nb);
        for (int t = b; t < nb; t++) {
            const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q4_nibbles(x[t].qs),
                                                  _mm256_loadu_si256((const __m256i *)((const int8_t *)acts[i] + QK32 * t)));
            s += _cvtsh_ss(x[t].d) * (dy[t] * hsum256_ps(_mm256_cvtepi32_ps(p)) - 8.0f * sy[t]);
        }
        out[i] = s;
    }
}

INLINE void q4_K_n(int n, const block_q4_K *x, const void *const *acts, const int na, float *out) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m512 acc[FM_DOTN_MAX];
    __m128 accm[FM_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) { acc[i] = _mm512_setzero_ps(); accm[i] = _mm_setzero_ps(); }
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i v8 = k4_scales_mins(x[b].scales);
        const __m512i sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(v8));
        const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(v8, 8));
        __m512i si[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) si[i] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * j));
            const __m512i u = join(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
            const __m512i scale = pick512(sc, j);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) si[i] = step512(si[i], u, ACT(i)[b].qs + 64 * j, scale);
        }
        const float d = _cvtsh_ss(x[b].d), dmin = _cvtsh_ss(x[b].dmin);
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            const block_a8_256 *y = ACT(i) + b;
            const __m128i sums32 = _mm_load_si128((const __m128i *)y->sums32);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si[i]), _mm512_set1_ps(d * y->d), acc[i]);
            accm[i] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mins, sums32)), _mm_set1_ps(dmin * y->d), accm[i]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = _mm512_reduce_add_ps(acc[i]) - hsum128_ps(accm[i]);
}

INLINE void q6_K_n(int n, const block_q6_K *x, const void *const *acts, const int na, float *out) {
    __m512 acc[FM_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) acc[i] = _mm512_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        __m512i si[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) si[i] = _mm512_zextsi256_si512(q6_offset(s8, ACT(i)[b].bsums));
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            const __m512i sc = _mm512_broadcast_i32x4(_mm_cvtepi8_epi16(h ? _mm_srli_si128(s8, 8) : s8));
            _Pragma("GCC unroll 2")
            for (int pair = 0; pair < 2; pair++) {
                const __m512i u = q6_quants(x[b].ql + 64 * h, x[b].qh + 32 * h, pair);
                const __m512i scale = pick512(sc, 4 + pair);
                _Pragma("GCC unroll 4")
                for (int i = 0; i < na; i++) si[i] = step512(si[i], u, ACT(i)[b].qs + 128 * h + 64 * pair, scale);
            }
        }
        const float d = _cvtsh_ss(x[b].d);
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++)
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si[i]), _mm512_set1_ps(d * ACT(i)[b].d), acc[i]);
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = _mm512_reduce_add_ps(acc[i]);
}

FM_DEFINE_DOTN(fm_dotn_q4_0_a8_avx512, q4_0_n, block_q4_0)
FM_DEFINE_DOTN(fm_dotn_q4_K_a8_avx512, q4_K_n, block_q4_K)
FM_DEFINE_DOTN(fm_dotn_q6_K_a8_avx512, q6_K_n, block_q6_K)
