/* AVX2 dot products of a Q6_Kp row (Q6_K repacked, quants.h) with up to FM_DOTN_MAX
 * activation rows in the same order: the quants of each 128 values are unpacked once (11
 * operations for four registers) and dotted with every activation, each pair of registers
 * that share their sub-blocks through one `vpmaddwd`. Per 32 values and activation that is
 * 2.5 operations, 1.5 of them multiplies, against 3 and 2 for the GGUF layout (dotn_avx2.c).
 * Built with -mavx2 -mfma -mf16c; the AVX-512 dispatch row uses these too. */
#include <immintrin.h>
#include "quants.h"
#include "simd256.h"

#define INLINE static inline __attribute__((always_inline))
#define LOAD(p) _mm256_loadu_si256((const __m256i *)(p))

// pshufb patterns over 8 int16 scales in both 128-bit lanes: for registers A+B, scales 0, 1 in
// the low lane and 4, 5 in the high one (4 int16 lanes each); for C+D, scales 2, 3 and 6, 7
static const uint8_t PAIRS[2][32] __attribute__((aligned(32))) = {
#define Q(s) 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1, 2 * (s), 2 * (s) + 1
    { Q(0), Q(1), Q(4), Q(5) }, { Q(2), Q(3), Q(6), Q(7) },
#undef Q
};

INLINE void q6_Kp_n(int n, const block_q6_Kp *x, const void *const *acts, const int na, float *out) {
    const __m256i m6 = _mm256_set1_epi8(63), m4 = _mm256_set1_epi8(0xF), top = _mm256_set1_epi8(0x30);
    float sums[FM_DOTN_MAX][8] __attribute__((aligned(32))) = { { 0 } };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        __m256i si[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) si[i] = q6_offset(s8, ((const block_a8_256 *)acts[i])[b].bsums);
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            const uint8_t *pl = x[b].planes[h][0];
            const __m256i sc = q6_half_scales(s8, h);
            const __m256i X = LOAD(pl), Y = LOAD(pl + 32), Z = LOAD(pl + 64);
            const __m256i A = _mm256_and_si256(X, m6), B = _mm256_and_si256(Y, m6);
            const __m256i sab = _mm256_shuffle_epi8(sc, _mm256_load_si256((const __m256i *)PAIRS[0]));
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) {
                const int8_t *v = ((const block_a8_256 *)acts[i])[b].qs + 128 * h;
                const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(A, LOAD(v)), _mm256_maddubs_epi16(B, LOAD(v + 32)));
                si[i] = _mm256_add_epi32(si[i], _mm256_madd_epi16(p, sab));
                __asm__("" : "+x"(si[i]));   // one running sum per activation, not a tree of temporaries
            }
            const __m256i C = _mm256_or_si256(_mm256_and_si256(Z, m4), _mm256_and_si256(_mm256_srli_epi16(X, 2), top));
            const __m256i D = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(Z, 4), m4),
                                              _mm256_and_si256(_mm256_srli_epi16(Y, 2), top));
            const __m256i scd = _mm256_shuffle_epi8(sc, _mm256_load_si256((const __m256i *)PAIRS[1]));
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) {
                const int8_t *v = ((const block_a8_256 *)acts[i])[b].qs + 128 * h;
                const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(C, LOAD(v + 64)), _mm256_maddubs_epi16(D, LOAD(v + 96)));
                si[i] = _mm256_add_epi32(si[i], _mm256_madd_epi16(p, scd));
                __asm__("" : "+x"(si[i]));
            }
        }
        const float d = _cvtsh_ss(x[b].d);
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++)
            accumulate8(sums[i], si[i], d * ((const block_a8_256 *)acts[i])[b].d);
        __asm__ volatile("" ::: "memory");   // keep the sums in memory, out of the register budget
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = hsum256_ps(_mm256_load_ps(sums[i]));
}

float fm_dot_q6_Kp_a8_avx2(int n, const void *w, const void *a) {
    float out;
    q6_Kp_n(n, w, &a, 1, &out);
    return out;
}

FM_DEFINE_DOTN(fm_dotn_q6_Kp_a8_avx2, q6_Kp_n, block_q6_Kp)
