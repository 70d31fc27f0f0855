/* AVX2 dot products of one weight row with up to FM_DOTN_MAX activation rows (batched
 * decode): each weight block is loaded and unpacked once and multiplied into every
 * activation. Q4_0, Q4_K and Q6_K (the bulk of Q4_0 and Q4_K_M files); other types loop the
 * single-row kernels. Built with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include "quants.h"
#include "simd256.h"

#define INLINE static inline __attribute__((always_inline))

#define LOAD(p) _mm256_loadu_si256((const __m256i *)(p))

// ---- Q4_0

INLINE __m256 udot(__m256i u, const int8_t *a) {
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, LOAD(a)), _mm256_set1_epi16(1)));
}

INLINE void q4_0_n(int n, const block_q4_0 *x, const void *const *acts, const int na, float *out) {
    const int nb = n / QK32;
    __m256 acc[FM_DOTN_MAX], off[FM_DOTN_MAX];
    float dd[FM_DOTN_MAX][8] __attribute__((aligned(32)));   // dw * da of the 8 blocks in flight
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) acc[i] = off[i] = _mm256_setzero_ps();
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        fm_prefetch_ahead(x + b, 8 * sizeof *x);
        const __m256 dw = scales8((const uint8_t *)&x[b].d, sizeof(block_q4_0));
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            _mm256_store_ps(dd[i], _mm256_mul_ps(dw, _mm256_loadu_ps(fm_a32_d(acts[i], nb) + b)));
            off[i] = _mm256_fmadd_ps(dw, _mm256_loadu_ps(fm_a32_s(acts[i], nb) + b), off[i]);
        }
        // the scales are read through one opaque base: with 32 known addresses the compiler
        // keeps each one in a stack slot and reloads it before its broadcast
        const float *ddp = &dd[0][0];
        __asm__("" : "+r"(ddp));
        _Pragma("GCC unroll 8")
        for (int k = 0; k < 8; k++) {
            const __m256i u = q4_nibbles(x[b + k].qs);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++)
                acc[i] = _mm256_fmadd_ps(udot(u, (const int8_t *)acts[i] + QK32 * (b + k)),
                                         _mm256_broadcast_ss(ddp + 8 * i + k), acc[i]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) {
        float s = hsum256_ps(acc[i]) - 8.0f * hsum256_ps(off[i]);
        const float *dy = fm_a32_d(acts[i], nb), *sy = fm_a32_s(acts[i], nb);
        for (int t = b; t < nb; t++)
            s += _cvtsh_ss(x[t].d) * (dy[t] * hsum256_ps(udot(q4_nibbles(x[t].qs), (const int8_t *)acts[i] + QK32 * t)) - 8.0f * sy[t]);
        out[i] = s;
    }
}

// ---- K-quants

// the pshufb pattern of `row` (see PATTERNS) read from memory at each use: hoisted into
// registers by the compiler, the twelve patterns would push the accumulators onto the stack
INLINE __m256i pick_mem(__m256i v, int row) {
    const uint8_t *patterns = &PATTERNS[0][0];
    __asm__("" : "+r"(patterns));
    return _mm256_shuffle_epi8(v, _mm256_load_si256((const __m256i *)(patterns + 32 * row)));
}

// Register budget as in q6_K_n below: the integer sums in registers, the float sums in memory.
INLINE void q4_K_n(int n, const block_q4_K *x, const void *const *acts, const int na, float *out) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    float sums[FM_DOTN_MAX][8] __attribute__((aligned(32))) = { { 0 } };
    float mins[FM_DOTN_MAX][4] __attribute__((aligned(16))) = { { 0 } };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i v8 = k4_scales_mins(x[b].scales);
        const __m128i m16 = _mm_cvtepu8_epi16(_mm_srli_si128(v8, 8));
        const float d = _cvtsh_ss(x[b].d), dmin = _cvtsh_ss(x[b].dmin);
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {   // the mins . the sums of each 32 activations
            const block_a8_256 *y = (const block_a8_256 *)acts[i] + b;
            const __m128i sums32 = _mm_load_si128((const __m128i *)y->sums32);
            _mm_store_ps(mins[i], _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(m16, sums32)),
                                               _mm_set1_ps(dmin * y->d), _mm_load_ps(mins[i])));
        }
        const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(v8));
        __m256i si[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) si[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 8")
        for (int k = 0; k < 8; k++) {   // sub-block k: low (even k) or high nibbles of 32 bytes
            const __m256i qq = LOAD(x[b].qs + 32 * (k / 2));
            const __m256i u = _mm256_and_si256(k & 1 ? _mm256_srli_epi16(qq, 4) : qq, m4);
            const __m256i scale = pick_mem(sc, k);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) {
                si[i] = _mm256_add_epi32(si[i], dot32_scaled(u, ((const block_a8_256 *)acts[i])[b].qs + 32 * k, scale));
                __asm__("" : "+x"(si[i]));
            }
        }
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++)
            accumulate8(sums[i], si[i], d * ((const block_a8_256 *)acts[i])[b].d);
        __asm__ volatile("" ::: "memory");
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = hsum256_ps(_mm256_load_ps(sums[i])) - hsum128_ps(_mm_load_ps(mins[i]));
}

// Register budget (16 ymm): si[na] accumulators, the scales, one unpacked group, two masks.
// The float sums live in memory and are touched once per super-block.
INLINE void q6_K_n(int n, const block_q6_K *x, const void *const *acts, const int na, float *out) {
    float sums[FM_DOTN_MAX][8] __attribute__((aligned(32))) = { { 0 } };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        __m256i si[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) si[i] = q6_offset(s8, ((const block_a8_256 *)acts[i])[b].bsums);
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[b].ql + 64 * h, *qh = x[b].qh + 32 * h;
            const __m256i sc = q6_half_scales(s8, h);
            _Pragma("GCC unroll 4")
            for (int g = 0; g < 4; g++) {
                const __m256i u = q6_group(ql, qh, g);
                const __m256i scale = pick_mem(sc, 8 + g);
                _Pragma("GCC unroll 4")
                for (int i = 0; i < na; i++) {
                    si[i] = _mm256_add_epi32(si[i], dot32_scaled(u, ((const block_a8_256 *)acts[i])[b].qs + 128 * h + 32 * g, scale));
                    __asm__("" : "+x"(si[i]));   // one running sum per activation, not a tree of temporaries
                }
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

FM_DEFINE_DOTN(fm_dotn_q4_0_a8_avx2, q4_0_n, block_q4_0)
FM_DEFINE_DOTN(fm_dotn_q4_K_a8_avx2, q4_K_n, block_q4_K)
FM_DEFINE_DOTN(fm_dotn_q6_K_a8_avx2, q6_K_n, block_q6_K)
