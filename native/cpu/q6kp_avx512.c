/* AVX-512 VNNI dot products of a Q6_Kp row (Q6_K repacked, quants.h) with up to FM_DOTN_MAX
 * activation rows in the same order. The block's four 64-byte registers unpack in 9
 * operations (`vpternlogd` merges the top bits), and since 32-bit lane k of every register
 * holds sub-block k, `vpdpbusd` sums all four into one register of 16 sub-block sums per
 * activation, scaled once in floats: 4 multiplies per block and activation where the
 * GGUF-layout kernel (dotn_avx512.c) takes 8, and 9 unpacking operations where it takes 48.
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni. */
#include <immintrin.h>
#include "quants.h"

#define INLINE static inline __attribute__((always_inline))
#define ACT(i) ((const block_a8_256 *)acts[i])
#define LOAD(p) _mm512_loadu_si512((const void *)(p))

// the 6-bit quants of registers R0..R3 (quants.h: X = R0 | R2.hi2 << 6, Y = R1 | R3.hi2 << 6,
// Z = R2.lo4 | R3.lo4 << 4)
INLINE void q6kp_unpack(const uint8_t planes[3][64], __m512i r[4]) {
    const __m512i X = LOAD(planes[0]), Y = LOAD(planes[1]), Z = LOAD(planes[2]);
    const __m512i m6 = _mm512_set1_epi8(63), m4 = _mm512_set1_epi8(0xF), hi2 = _mm512_set1_epi8((char)0xC0);
    r[0] = _mm512_and_si512(X, m6);
    r[1] = _mm512_and_si512(Y, m6);
    // bits 0..3 from Z (0xE4: c ? a : b, c the mask), bits 4..5 from the top of X or Y, 6..7 clear
    r[2] = _mm512_ternarylogic_epi32(Z, _mm512_srli_epi16(_mm512_and_si512(X, hi2), 2), m4, 0xE4);
    r[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(Z, 4), _mm512_srli_epi16(_mm512_and_si512(Y, hi2), 2), m4, 0xE4);
}

INLINE void q6_Kp_n(int n, const block_q6_Kp *x, const void *const *acts, const int na, float *out) {
    __m512 acc[FM_DOTN_MAX];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) acc[i] = _mm512_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m512i r[4];
        q6kp_unpack(x[b].planes, r);
        // scale k times d in lane k; the stored quants are offset by +32, taken out through
        // the activation sums of each sub-block
        const __m512 scale = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)x[b].scales))),
                                           _mm512_set1_ps(_cvtsh_ss(x[b].d)));
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            const block_a8_256 *y = ACT(i) + b;
            __m512i s = _mm512_sub_epi32(_mm512_setzero_si512(),
                                         _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_load_si256((const __m256i *)y->bsums)), 5));
            _Pragma("GCC unroll 4")
            for (int k = 0; k < 4; k++) s = _mm512_dpbusd_epi32(s, r[k], LOAD(y->qs + 64 * k));
            acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), scale), _mm512_set1_ps(y->d), acc[i]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = _mm512_reduce_add_ps(acc[i]);
}

float fm_dot_q6_Kp_a8_avx512(int n, const void *w, const void *a) {
    float out;
    q6_Kp_n(n, w, &a, 1, &out);
    return out;
}

FM_DEFINE_DOTN(fm_dotn_q6_Kp_a8_avx512, q6_Kp_n, block_q6_Kp)
