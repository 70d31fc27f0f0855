/* AVX2 dot products of the other 32-value block types (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) with
 * one (the row kernels) or up to FM_DOTN_MAX (batched decode) 8-bit activation rows: each block
 * is unpacked once into 32 bytes and multiplied into every activation by one `vpmaddubsw`.
 * Per block the integer sum S = sum(u * q) of the unpacked bytes u; the block adds
 * dw * da * S + c * s, with s = da * sum(q) the activation block's sum and c the min (Q4_1,
 * Q5_1) or -offset * dw where u is the code plus an offset (16 for Q5_0, 12 for MXFP4's code
 * book looked up with `vpshufb`). IQ4_NL's code book spans -127..113: its bytes stay signed
 * and multiply as |u| . sign(q, u), with no offset. Built with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include "quants.h"
#include "simd256.h"
#include "q32_blocks256.h"

#define LOAD(p) _mm256_loadu_si256((const __m256i *)(p))

INLINE __m256i udot(__m256i u, const int8_t *a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, LOAD(a)), _mm256_set1_epi16(1));
}

// signed bytes: pairs of products of at most 127 * 127 fit `vpmaddubsw`'s int16 lanes
INLINE __m256i sdot(__m256i v, const int8_t *a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(LOAD(a), v)),
                             _mm256_set1_epi16(1));
}

// ---- the kernel of one type: T the prefix of its pieces; HALF 0.5 where T##_dw gives twice
// dw (MXFP4); HAS_C whether blocks add c * s; DOT udot or sdot; BOOK its code book in both
// 128-bit lanes (unused by the linear types). The row kernel is its na = 1 instance, with four
// accumulators to keep the FMA latency off the critical path (two at na = 2)
#define Q32_KERNEL(T, block_t, HALF, HAS_C, DOT, BOOK)                                                  \
    INLINE void T##_n(int n, const block_t *x, const void *const *acts, const int na, float *out) {    \
        const int nb = n / QK32, nacc = na == 1 ? 4 : na == 2 ? 2 : 1;                                  \
        const __m256i book = BOOK;                                                                       \
        __m256 acc[4][FM_DOTN_MAX], off[FM_DOTN_MAX];                                                    \
        float dd[FM_DOTN_MAX][8] __attribute__((aligned(32)));                                          \
        _Pragma("GCC unroll 4")                                                                          \
        for (int i = 0; i < na; i++) {                                                                   \
            off[i] = _mm256_setzero_ps();                                                                \
            _Pragma("GCC unroll 4")                                                                      \
            for (int j = 0; j < nacc; j++) acc[j][i] = off[i];                                           \
        }                                                                                                \
        int b = 0;                                                                                       \
        for (; b + 8 <= nb; b += 8) {                                                                    \
            fm_prefetch_ahead(x + b, 8 * sizeof *x);                                                     \
            const __m256 dw = T##_dw(x + b);                                                             \
            _Pragma("GCC unroll 4")                                                                      \
            for (int i = 0; i < na; i++) {                                                               \
                const __m256 da = _mm256_loadu_ps(fm_a32_d(acts[i], nb) + b);                            \
                _mm256_store_ps(dd[i], _mm256_mul_ps(dw, HALF == 1.0f ? da : _mm256_mul_ps(da, _mm256_set1_ps(HALF)))); \
                if (HAS_C) off[i] = _mm256_fmadd_ps(T##_c(x + b, dw), _mm256_loadu_ps(fm_a32_s(acts[i], nb) + b), off[i]); \
            }                                                                                            \
            /* the scales read through one opaque base, not one stack slot each (qx_batch_avx2.c) */    \
            const float *ddp = &dd[0][0];                                                                \
            __asm__("" : "+r"(ddp));                                                                     \
            _Pragma("GCC unroll 8")                                                                      \
            for (int k = 0; k < 8; k++) {                                                                \
                const __m256i u = T##_u(x + b + k, book);                                                \
                _Pragma("GCC unroll 4")                                                                  \
                for (int i = 0; i < na; i++)                                                             \
                    acc[k % nacc][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(u, (const int8_t *)acts[i] + QK32 * (b + k))), \
                                                       _mm256_broadcast_ss(ddp + 8 * i + k), acc[k % nacc][i]); \
            }                                                                                            \
        }                                                                                                \
        _Pragma("GCC unroll 4")                                                                          \
        for (int i = 0; i < na; i++) {                                                                   \
            _Pragma("GCC unroll 4")                                                                      \
            for (int j = 1; j < nacc; j++) acc[0][i] = _mm256_add_ps(acc[0][i], acc[j][i]);              \
            float s = hsum256_ps(acc[0][i]) + (HAS_C ? hsum256_ps(off[i]) : 0.0f);                       \
            const float *dy = fm_a32_d(acts[i], nb), *sy = fm_a32_s(acts[i], nb);                        \
            for (int t = b; t < nb; t++) {                                                               \
                const float dot = hsum256_ps(_mm256_cvtepi32_ps(DOT(T##_u(x + t, book), (const int8_t *)acts[i] + QK32 * t))); \
                s += T##_dw1(x + t) * dy[t] * dot + (HAS_C ? T##_c1(x + t) * sy[t] : 0.0f);            \
            }                                                                                            \
            out[i] = s;                                                                                  \
        }                                                                                                \
    }                                                                                                    \
    FM_DEFINE_DOT1(fm_dot_##T##_a8_avx2, T##_n, block_t)                                                 \
    FM_DEFINE_DOTN(fm_dotn_##T##_a8_avx2, T##_n, block_t)

Q32_KERNEL(q4_1, block_q4_1, 1.0f, 1, udot, _mm256_setzero_si256())
Q32_KERNEL(q5_0, block_q5_0, 1.0f, 1, udot, _mm256_setzero_si256())
Q32_KERNEL(q5_1, block_q5_1, 1.0f, 1, udot, _mm256_setzero_si256())
Q32_KERNEL(iq4_nl, block_iq4_nl, 1.0f, 0, sdot, book256(fm_kvalues_iq4nl, 0))
Q32_KERNEL(mxfp4, block_mxfp4, 0.5f, 1, udot, book256(fm_kvalues_mxfp4, MXFP4_OFFSET))
