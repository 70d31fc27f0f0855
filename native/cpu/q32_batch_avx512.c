/* AVX-512 VNNI dot products of the other 32-value block types (Q4_1, Q5_0, Q5_1, IQ4_NL,
 * MXFP4) with one (the row kernels) or up to FM_DOTN_MAX (batched decode) 8-bit activation
 * rows: two blocks per 512-bit `vpdpbusd` on unsigned bytes, the code plus an offset where it
 * can be negative (16 for Q5_0, 12 for MXFP4, 128 for IQ4_NL; their code books looked up with
 * `vpshufb`), taken out with the mins of Q4_1 and Q5_1 through the activation block sums
 * (q32_blocks256.h). Built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni. */
#include <immintrin.h>
#include "quants.h"
#include "simd256.h"
#include "simd512.h"
#include "q32_blocks256.h"

// blocks x[0] and x[1] as 64 unsigned bytes; the 5-bit types add their fifth bits (qh of both
// blocks, one bit a byte) as 16 under a byte mask
INLINE __m512i nibbles2(const uint8_t *qs0, const uint8_t *qs1) { return join(q4_nibbles(qs0), q4_nibbles(qs1)); }

INLINE __m512i with_fifth_bits(__m512i u, const uint8_t *qh0, const uint8_t *qh1) {
    uint32_t h0, h1;
    __builtin_memcpy(&h0, qh0, 4);
    __builtin_memcpy(&h1, qh1, 4);
    return _mm512_mask_add_epi8(u, _cvtu64_mask64(h0 | (uint64_t)h1 << 32), u, _mm512_set1_epi8(0x10));
}

INLINE __m512i q4_1_u2(const block_q4_1 *x, __m512i book) { (void)book; return nibbles2(x[0].qs, x[1].qs); }
INLINE __m512i q5_0_u2(const block_q5_0 *x, __m512i book) {
    (void)book;
    return with_fifth_bits(nibbles2(x[0].qs, x[1].qs), x[0].qh, x[1].qh);
}
INLINE __m512i q5_1_u2(const block_q5_1 *x, __m512i book) {
    (void)book;
    return with_fifth_bits(nibbles2(x[0].qs, x[1].qs), x[0].qh, x[1].qh);
}
INLINE __m512i iq4_nl_u2(const block_iq4_nl *x, __m512i book) { return _mm512_shuffle_epi8(book, nibbles2(x[0].qs, x[1].qs)); }
INLINE __m512i mxfp4_u2(const block_mxfp4 *x, __m512i book) { return _mm512_shuffle_epi8(book, nibbles2(x[0].qs, x[1].qs)); }

// T, HALF as in q32_batch_avx2.c; every type has a c here; BOOK its code book (plus its offset)
// in every 128-bit lane
#define Q32_KERNEL(T, block_t, HALF, BOOK, OFFSET)                                                      \
    INLINE void T##_n(int n, const block_t *x, const void *const *acts, const int na, float *out) {    \
        const int nb = n / QK32;                                                                         \
        const __m512i book = _mm512_broadcast_i32x4(_mm_add_epi8(BOOK, _mm_set1_epi8((char)(OFFSET)))); \
        __m512 acc[FM_DOTN_MAX];                                                                         \
        __m256 off[FM_DOTN_MAX];                                                                         \
        _Pragma("GCC unroll 4")                                                                          \
        for (int i = 0; i < na; i++) { acc[i] = _mm512_setzero_ps(); off[i] = _mm256_setzero_ps(); }    \
        int b = 0;                                                                                       \
        for (; b + 8 <= nb; b += 8) {                                                                    \
            fm_prefetch_ahead(x + b, 8 * sizeof *x);                                                     \
            const __m256 dw = T##_dw(x + b), c = T##_c(x + b, dw);                                       \
            __m512 dd[FM_DOTN_MAX];                                                                      \
            _Pragma("GCC unroll 4")                                                                      \
            for (int i = 0; i < na; i++) {                                                               \
                const __m256 da = _mm256_loadu_ps(fm_a32_d(acts[i], nb) + b);                            \
                dd[i] = _mm512_castps256_ps512(_mm256_mul_ps(dw, HALF == 1.0f ? da : _mm256_mul_ps(da, _mm256_set1_ps(HALF)))); \
                off[i] = _mm256_fmadd_ps(c, _mm256_loadu_ps(fm_a32_s(acts[i], nb) + b), off[i]);         \
            }                                                                                            \
            _Pragma("GCC unroll 4")                                                                      \
            for (int k = 0; k < 8; k += 2) {                                                             \
                const __m512i u = T##_u2(x + b + k, book);                                               \
                _Pragma("GCC unroll 4")                                                                  \
                for (int i = 0; i < na; i++) {                                                           \
                    const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,                     \
                        _mm512_loadu_si512((const void *)((const int8_t *)acts[i] + QK32 * (b + k))));   \
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), lane_pair(dd[i], k), acc[i]);        \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        const __m256i book256 = _mm512_castsi512_si256(book);                                            \
        _Pragma("GCC unroll 4")                                                                          \
        for (int i = 0; i < na; i++) {                                                                   \
            float s = _mm512_reduce_add_ps(acc[i]) + hsum256_ps(off[i]);                                 \
            const float *dy = fm_a32_d(acts[i], nb), *sy = fm_a32_s(acts[i], nb);                        \
            for (int t = b; t < nb; t++) {                                                               \
                const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), T##_u(x + t, book256),     \
                    _mm256_loadu_si256((const __m256i *)((const int8_t *)acts[i] + QK32 * t)));          \
                s += T##_dw1(x + t) * dy[t] * hsum256_ps(_mm256_cvtepi32_ps(p)) + T##_c1(x + t) * sy[t]; \
            }                                                                                            \
            out[i] = s;                                                                                  \
        }                                                                                                \
    }                                                                                                    \
    FM_DEFINE_DOT1(fm_dot_##T##_a8_avx512, T##_n, block_t)                                               \
    FM_DEFINE_DOTN(fm_dotn_##T##_a8_avx512, T##_n, block_t)

#define NO_BOOK _mm_setzero_si128()
#define BOOK(values) _mm_loadu_si128((const __m128i *)(values))

Q32_KERNEL(q4_1, block_q4_1, 1.0f, NO_BOOK, 0)
Q32_KERNEL(q5_0, block_q5_0, 1.0f, NO_BOOK, 0)
Q32_KERNEL(q5_1, block_q5_1, 1.0f, NO_BOOK, 0)
Q32_KERNEL(iq4_nl, block_iq4_nl, 1.0f, BOOK(fm_kvalues_iq4nl), 128)
Q32_KERNEL(mxfp4, block_mxfp4, 0.5f, BOOK(fm_kvalues_mxfp4), MXFP4_OFFSET)
