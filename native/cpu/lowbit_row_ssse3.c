/* SSSE3 dot products of the lower-bit super-blocks (Q2_K, Q3_K, IQ4_XS, TQ2_0, TQ1_0) with 8-bit
 * activations: unsigned quants times signed activations by `pmaddubsw` (IQ4_XS's signed code
 * book values through `psignb`), sub-block scales broadcast by `pshufb` and applied by `pmaddwd`;
 * Q2_K's mins, Q3_K's offset of 4 and the ternary types' offset of 1 through the activation
 * block sums. Built with -mssse3 only; must hold no AVX instruction. */
#include <tmmintrin.h>
#include "lowbit_simd.h"
#include "simd128.h"

#define LOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define ALOAD(p) _mm_load_si128((const __m128i *)(p))   // activation quants and sums: 16-byte aligned (quants.h)
#define INLINE static inline __attribute__((always_inline))

// int16 lane k of v broadcast to all 8 lanes
INLINE __m128i bcast16(__m128i v, int k) {
    const short pair = (short)(2 * k | (2 * k + 1) << 8);
    return _mm_shuffle_epi8(v, _mm_set1_epi16(pair));
}

// the 2-bit field j (bits 2j, 2j+1) of every byte of q
INLINE __m128i bits2(__m128i q, int j) {
    return _mm_and_si128(j ? _mm_srli_epi16(q, 2 * j) : q, _mm_set1_epi8(3));
}

// bit k of every byte of h, moved to bit 2 (the 16-bit shifts bring in no other bit 2)
INLINE __m128i bit_to_4(__m128i h, int k) {
    const __m128i moved = k >= 2 ? _mm_srli_epi16(h, k - 2) : _mm_slli_epi16(h, 2 - k);
    return _mm_and_si128(moved, _mm_set1_epi8(4));
}

// the 2-bit quants (and Q3_K's third bit) of values 128h + 32j .. +31, as two vectors of 16,
// times the activations, scaled by the scales of their two groups of 16 (int16 lanes 2j and
// 2j + 1 of sc) -> 4 int32
INLINE __m128i q2_step(__m128i u0, __m128i u1, const int8_t *v, __m128i sc, int j) {
    return _mm_add_epi32(_mm_madd_epi16(_mm_maddubs_epi16(u0, ALOAD(v)), bcast16(sc, 2 * j)),
                         _mm_madd_epi16(_mm_maddubs_epi16(u1, ALOAD(v + 16)), bcast16(sc, 2 * j + 1)));
}

float fm_dot_q2_K_a8_ssse3(int n, const void *w, const void *a) {
    const block_q2_K *x = w;
    const block_a8_256 *y = a;
    const __m128i m4 = _mm_set1_epi8(0xF), zero = _mm_setzero_si128();
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i s8 = LOAD(x[b].scales), sc = _mm_and_si128(s8, m4), mn = _mm_and_si128(_mm_srli_epi16(s8, 4), m4);
        const __m128i md = _mm_add_epi32(_mm_madd_epi16(_mm_unpacklo_epi8(mn, zero), ALOAD(y[b].bsums)),
                                         _mm_madd_epi16(_mm_unpackhi_epi8(mn, zero), ALOAD(y[b].bsums + 8)));
        __m128i si = _mm_setzero_si128();
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            const __m128i q0 = LOAD(x[b].qs + 32 * h), q1 = LOAD(x[b].qs + 32 * h + 16);
            const __m128i sc16 = h ? _mm_unpackhi_epi8(sc, zero) : _mm_unpacklo_epi8(sc, zero);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++)
                si = _mm_add_epi32(si, q2_step(bits2(q0, j), bits2(q1, j), y[b].qs + 128 * h + 32 * j, sc16, j));
        }
        const float dy = y[b].d;
        acc = _mm_add_ps(acc, _mm_sub_ps(_mm_mul_ps(_mm_cvtepi32_ps(si), _mm_set1_ps(fm_half(x[b].d) * dy)),
                                         _mm_mul_ps(_mm_cvtepi32_ps(md), _mm_set1_ps(fm_half(x[b].dmin) * dy))));
    }
    return hsum128_ps(acc);
}

float fm_dot_q3_K_a8_ssse3(int n, const void *w, const void *a) {
    const block_q3_K *x = w;
    const block_a8_256 *y = a;
    const __m128i off = _mm_set1_epi16(32), zero = _mm_setzero_si128();
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i s8 = q3k_scales8(x[b].scales);
        const __m128i s16[2] = { _mm_sub_epi16(_mm_unpacklo_epi8(s8, zero), off), _mm_sub_epi16(_mm_unpackhi_epi8(s8, zero), off) };
        // the quants are stored as the value plus 4: -4 * sum_g scale_g * bsum_g
        const __m128i c = _mm_add_epi32(_mm_madd_epi16(s16[0], ALOAD(y[b].bsums)), _mm_madd_epi16(s16[1], ALOAD(y[b].bsums + 8)));
        __m128i si = _mm_sub_epi32(zero, _mm_slli_epi32(c, 2));
        const __m128i h0 = LOAD(x[b].hmask), h1 = LOAD(x[b].hmask + 16);
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            const __m128i q0 = LOAD(x[b].qs + 32 * h), q1 = LOAD(x[b].qs + 32 * h + 16);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) {
                const __m128i u0 = _mm_or_si128(bits2(q0, j), bit_to_4(h0, 4 * h + j));
                const __m128i u1 = _mm_or_si128(bits2(q1, j), bit_to_4(h1, 4 * h + j));
                si = _mm_add_epi32(si, q2_step(u0, u1, y[b].qs + 128 * h + 32 * j, s16[h], j));
            }
        }
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(si), _mm_set1_ps(fm_half(x[b].d) * y[b].d)));
    }
    return hsum128_ps(acc);
}

// 16 code book values (signed) . 16 activations: |k| times the activations with k's signs
INLINE __m128i signed_dot16(__m128i k, const int8_t *v) {
    return _mm_maddubs_epi16(_mm_sign_epi8(k, k), _mm_sign_epi8(ALOAD(v), k));
}

float fm_dot_iq4_xs_a8_ssse3(int n, const void *w, const void *a) {
    const block_iq4_xs *x = w;
    const block_a8_256 *y = a;
    const __m128i m4 = _mm_set1_epi8(0xF), kv = iq4_codebook();
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i sc = iq4xs_scales16(&x[b]);
        __m128i si = _mm_setzero_si128();
        _Pragma("GCC unroll 8")
        for (int ib = 0; ib < 8; ib++) {
            const __m128i q = LOAD(x[b].qs + 16 * ib), s = bcast16(sc, ib);
            const int8_t *v = y[b].qs + 32 * ib;
            // two `pmaddwd`: the two int16 products of a lane may reach 2 * 2 * 127 * 127
            si = _mm_add_epi32(si, _mm_madd_epi16(signed_dot16(_mm_shuffle_epi8(kv, _mm_and_si128(q, m4)), v), s));
            si = _mm_add_epi32(si, _mm_madd_epi16(signed_dot16(_mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(q, 4), m4)), v + 16), s));
        }
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(si), _mm_set1_ps(fm_half(x[b].d) * y[b].d)));
    }
    return hsum128_ps(acc);
}

// the ternary types: digits (0..2) times activations summed as int16 from minus the activation
// sums (the offset of 1), at most 16 * 2 * 2 * 127 + 2 * 16 * 127 per lane, and one `pmaddwd`
float fm_dot_tq2_0_a8_ssse3(int n, const void *w, const void *a) {
    const block_tq2_0 *x = w;
    const block_a8_256 *y = a;
    const __m128i ones = _mm_set1_epi16(1);
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m128i p = _mm_sub_epi16(_mm_setzero_si128(), _mm_add_epi16(ALOAD(y[b].bsums), ALOAD(y[b].bsums + 8)));
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            const __m128i q0 = LOAD(x[b].qs + 32 * h), q1 = LOAD(x[b].qs + 32 * h + 16);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) {
                const int8_t *v = y[b].qs + 128 * h + 32 * j;
                p = _mm_add_epi16(p, _mm_add_epi16(_mm_maddubs_epi16(bits2(q0, j), ALOAD(v)),
                                                   _mm_maddubs_epi16(bits2(q1, j), ALOAD(v + 16))));
            }
        }
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(_mm_madd_epi16(p, ones)), _mm_set1_ps(fm_half(x[b].d) * y[b].d)));
    }
    return hsum128_ps(acc);
}

float fm_dot_tq1_0_a8_ssse3(int n, const void *w, const void *a) {
    const block_tq1_0 *x = w;
    const block_a8_256 *y = a;
    const __m128i ones = _mm_set1_epi16(1);
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const int8_t *v = y[b].qs;
        __m128i p = _mm_sub_epi16(_mm_setzero_si128(), _mm_add_epi16(ALOAD(y[b].bsums), ALOAD(y[b].bsums + 8)));
        __m128i a0 = LOAD(x[b].qs), a1 = LOAD(x[b].qs + 16), b0 = LOAD(x[b].qs + 32);
        _Pragma("GCC unroll 5")
        for (int k = 0; k < 5; k++) {   // digit k: values 32k.. of qs[0..32], 160 + 16k.. of qs[32..48]
            p = _mm_add_epi16(p, _mm_maddubs_epi16(trits_epi8(a0), ALOAD(v + 32 * k)));
            p = _mm_add_epi16(p, _mm_maddubs_epi16(trits_epi8(a1), ALOAD(v + 32 * k + 16)));
            p = _mm_add_epi16(p, _mm_maddubs_epi16(trits_epi8(b0), ALOAD(v + 160 + 16 * k)));
            a0 = times3_epi8(a0);
            a1 = times3_epi8(a1);
            b0 = times3_epi8(b0);
        }
        p = _mm_add_epi16(p, _mm_maddubs_epi16(trits_epi8(tq1_qh_bytes(x[b].qh)), ALOAD(v + 240)));
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(_mm_madd_epi16(p, ones)), _mm_set1_ps(fm_half(x[b].d) * y[b].d)));
    }
    return hsum128_ps(acc);
}
