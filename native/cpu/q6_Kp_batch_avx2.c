/* AVX2 dot products of a Q6_Kp row (Q6_K repacked, quants.h) with up to FM_DOTN_MAX
 * activation rows in the same order: each 32-byte half of the four registers (128 values,
 * sub-blocks 8H..8H+7) is unpacked once (9 operations) and dotted with every activation,
 * each pair of registers through one `vpmaddwd` with the half's scale vector. Per 32 values
 * and activation that is 2.5 operations, 1.5 of them multiplies, against 3 and 2 for the GGUF
 * layout (qx_batch_avx2.c). Built with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include "quants.h"
#include "simd256.h"

#define INLINE static inline __attribute__((always_inline))
#define LOAD(p) _mm256_loadu_si256((const __m256i *)(p))

INLINE void q6_Kp_n(int n, const block_q6_Kp *x, const void *const *acts, const int na, float *out) {
    const __m256i m6 = _mm256_set1_epi8(63);
    float sums[FM_DOTN_MAX][8] __attribute__((aligned(32))) = { { 0 } };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        __m256i si[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) si[i] = q6_offset(s8, ((const block_a8_256 *)acts[i])[b].bsums);
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {   // 32-bit lane m of half h: sub-block 8h + m
            const uint8_t *pl = x[b].planes[0] + 32 * h;
            // int16 lanes 2m, 2m+1: scale 8h + m
            const __m128i half8 = h ? _mm_unpackhi_epi8(s8, s8) : _mm_unpacklo_epi8(s8, s8);
            const __m256i sc = _mm256_cvtepi8_epi16(half8);
            const __m256i X = LOAD(pl), Y = LOAD(pl + 64), Z = LOAD(pl + 128);
            const __m256i R0 = _mm256_and_si256(X, m6), R1 = _mm256_and_si256(Y, m6);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) {
                const int8_t *v = ((const block_a8_256 *)acts[i])[b].qs + 32 * h;
                const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(R0, LOAD(v)), _mm256_maddubs_epi16(R1, LOAD(v + 64)));
                si[i] = _mm256_add_epi32(si[i], _mm256_madd_epi16(p, sc));
                __asm__("" : "+x"(si[i]));   // one running sum per activation, not a tree of temporaries
            }
            const __m256i R2 = _mm256_and_si256(_mm256_xor_si256(Z, _mm256_srli_epi16(X, 2)), m6);
            const __m256i R3 = _mm256_and_si256(_mm256_xor_si256(_mm256_srli_epi16(Z, 2), _mm256_srli_epi16(Y, 6)), m6);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) {
                const int8_t *v = ((const block_a8_256 *)acts[i])[b].qs + 32 * h;
                const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(R2, LOAD(v + 128)), _mm256_maddubs_epi16(R3, LOAD(v + 192)));
                si[i] = _mm256_add_epi32(si[i], _mm256_madd_epi16(p, sc));
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
