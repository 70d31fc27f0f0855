/* SSSE3 dot products of K-quant super-blocks (Q4_K, Q5_K, Q6_K) with 8-bit activations:
 * unsigned quants times signed activations by `pmaddubsw`, per-sub-block scales broadcast by
 * `pshufb` and applied by `pmaddwd`; mins and the Q6_K offset go through the activation block
 * sums. Built with -mssse3 only; must hold no AVX instruction. */
#include <tmmintrin.h>
#include "quants.h"
#include "simd128.h"

#define LOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define ALOAD(p) _mm_load_si128((const __m128i *)(p))   // activation quants and sums: 16-byte aligned (quants.h)

// pshufb patterns: int16 lane k of a vector, broadcast to all 8 lanes
static const uint8_t BCAST16[8][16] __attribute__((aligned(16))) = {
#define B(k) { 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, \
               2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1 }
    B(0), B(1), B(2), B(3), B(4), B(5), B(6), B(7)
#undef B
};

static inline __m128i bcast16(__m128i v, int k) {
    return _mm_shuffle_epi8(v, _mm_load_si128((const __m128i *)BCAST16[k]));
}

// 32 unsigned quants (two halves) . 32 activations, times int16 scale vector -> 4 int32
static inline __m128i dot32_scaled(__m128i u0, __m128i u1, const int8_t *v, __m128i scale) {
    __m128i p = _mm_add_epi16(_mm_maddubs_epi16(u0, ALOAD(v)), _mm_maddubs_epi16(u1, ALOAD(v + 16)));
    return _mm_madd_epi16(p, scale);
}

// the scaled integer sums of one super-block of Q4_K quants (qs) . its 256 activations (v), with
// the 8 sub-block scales as int16 (sc), in the GGUF layout or in Q4_Kp's
typedef __m128i (*k4_sums_fn)(const uint8_t *qs, const int8_t *v, __m128i sc);

static inline __m128i q4k_sums(const uint8_t *q, const int8_t *v, __m128i sc) {
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m128i si = _mm_setzero_si128();
    _Pragma("GCC unroll 4")
    for (int j = 0; j < 4; j++, q += 32, v += 64) {
        const __m128i q0 = LOAD(q), q1 = LOAD(q + 16);
        si = _mm_add_epi32(si, dot32_scaled(_mm_and_si128(q0, m4), _mm_and_si128(q1, m4), v, bcast16(sc, 2 * j)));
        si = _mm_add_epi32(si, dot32_scaled(_mm_and_si128(_mm_srli_epi16(q0, 4), m4),
                                            _mm_and_si128(_mm_srli_epi16(q1, 4), m4), v + 32, bcast16(sc, 2 * j + 1)));
    }
    return si;
}

// Q4_Kp (quants.h): the low nibbles of all 8 registers hold sub-blocks 0..3, the high ones 4..7,
// so their `pmaddubsw` products add up as int16 (lanes 2m, 2m+1: sub-block m or 4 + m, at most
// 8 * 2 * 15 * 128 = 30720) and two `pmaddwd` apply the 8 scales, where the GGUF layout
// broadcasts a scale and applies it for each sub-block
static inline __m128i q4kp_sums(const uint8_t *q, const int8_t *v, __m128i sc) {
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m128i lo = _mm_setzero_si128(), hi = _mm_setzero_si128();
    _Pragma("GCC unroll 4")
    for (int r = 0; r < 8; r++, q += 16, v += 32) {
        const __m128i qq = LOAD(q);
        lo = _mm_add_epi16(lo, _mm_maddubs_epi16(_mm_and_si128(qq, m4), ALOAD(v)));
        hi = _mm_add_epi16(hi, _mm_maddubs_epi16(_mm_and_si128(_mm_srli_epi16(qq, 4), m4), ALOAD(v + 16)));
    }
    return _mm_add_epi32(_mm_madd_epi16(lo, _mm_unpacklo_epi16(sc, sc)), _mm_madd_epi16(hi, _mm_unpackhi_epi16(sc, sc)));
}

// sum over super-blocks of d * (scaled sums) - dmin * (mins . activation sums). d and dmin go
// through fm_half: real files hold subnormal f16 mins, which a conversion in vector registers
// (qx_0_row_ssse3.c) leaves as subnormal floats, one microcode assist each
static inline __attribute__((always_inline)) float dot_k4(int n, const void *w, const void *a, k4_sums_fn sums) {
    const block_q4_K *x = w;
    const block_a8_256 *y = a;
    __m128 acc = _mm_setzero_ps(), accm = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m128i md;
        const __m128i sc = k4_scales16(x[b].scales, y[b].sums32, &md);
        const __m128i si = sums(x[b].qs, y[b].qs, sc);
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(si), _mm_set1_ps(fm_half(x[b].d) * y[b].d)));
        accm = _mm_add_ps(accm, _mm_mul_ps(_mm_cvtepi32_ps(md), _mm_set1_ps(fm_half(x[b].dmin) * y[b].d)));
    }
    return hsum128_ps(_mm_sub_ps(acc, accm));
}

float fm_dot_q4_K_a8_ssse3(int n, const void *w, const void *a) { return dot_k4(n, w, a, q4k_sums); }
float fm_dot_q4_Kp_a8_ssse3(int n, const void *w, const void *a) { return dot_k4(n, w, a, q4kp_sums); }

float fm_dot_q5_K_a8_ssse3(int n, const void *w, const void *a) {
    const block_q5_K *x = w;
    const block_a8_256 *y = a;
    const __m128i m4 = _mm_set1_epi8(0xF), bit4 = _mm_set1_epi8(0x10);
    __m128 acc = _mm_setzero_ps(), accm = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m128i md;
        const __m128i sc = k4_scales16(x[b].scales, y[b].sums32, &md);
        const uint8_t *q = x[b].qs;
        const int8_t *v = y[b].qs;
        __m128i h0 = LOAD(x[b].qh), h1 = LOAD(x[b].qh + 16);
        __m128i si = _mm_setzero_si128();
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++, q += 32, v += 64) {
            const __m128i q0 = LOAD(q), q1 = LOAD(q + 16);
            // bit 2j of qh -> bit 4 of the low quant; bit 2j+1 -> bit 4 of the high quant
            const __m128i lo0 = _mm_or_si128(_mm_and_si128(q0, m4), _mm_and_si128(_mm_slli_epi16(h0, 4), bit4));
            const __m128i lo1 = _mm_or_si128(_mm_and_si128(q1, m4), _mm_and_si128(_mm_slli_epi16(h1, 4), bit4));
            const __m128i hi0 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q0, 4), m4),
                                             _mm_and_si128(_mm_slli_epi16(h0, 3), bit4));
            const __m128i hi1 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q1, 4), m4),
                                             _mm_and_si128(_mm_slli_epi16(h1, 3), bit4));
            si = _mm_add_epi32(si, dot32_scaled(lo0, lo1, v, bcast16(sc, 2 * j)));
            si = _mm_add_epi32(si, dot32_scaled(hi0, hi1, v + 32, bcast16(sc, 2 * j + 1)));
            h0 = _mm_srli_epi16(h0, 2);
            h1 = _mm_srli_epi16(h1, 2);
        }
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(si), _mm_set1_ps(fm_half(x[b].d) * y[b].d)));
        accm = _mm_add_ps(accm, _mm_mul_ps(_mm_cvtepi32_ps(md), _mm_set1_ps(fm_half(x[b].dmin) * y[b].d)));
    }
    return hsum128_ps(_mm_sub_ps(acc, accm));
}

// 16 unsigned 6-bit quants . 16 activations, times an int16 scale vector -> 4 int32
static inline __m128i dot16_scaled(__m128i u, const int8_t *v, __m128i scale) {
    return _mm_madd_epi16(_mm_maddubs_epi16(u, ALOAD(v)), scale);
}

float fm_dot_q6_K_a8_ssse3(int n, const void *w, const void *a) {
    const block_q6_K *x = w;
    const block_a8_256 *y = a;
    const __m128i m4 = _mm_set1_epi8(0xF), m2 = _mm_set1_epi8(0x30);
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *v = y[b].qs;
        __m128i s16[2];
        __m128i si = q6_scales_offset(x[b].scales, y[b].bsums, s16);
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, v += 128) {
            const __m128i l0 = LOAD(ql), l1 = LOAD(ql + 16), l2 = LOAD(ql + 32), l3 = LOAD(ql + 48);
            const __m128i h0 = LOAD(qh), h1 = LOAD(qh + 16), sc = s16[h];
            si = _mm_add_epi32(si, dot16_scaled(_mm_or_si128(_mm_and_si128(l0, m4), _mm_and_si128(_mm_slli_epi16(h0, 4), m2)), v, bcast16(sc, 0)));
            si = _mm_add_epi32(si, dot16_scaled(_mm_or_si128(_mm_and_si128(l1, m4), _mm_and_si128(_mm_slli_epi16(h1, 4), m2)), v + 16, bcast16(sc, 1)));
            si = _mm_add_epi32(si, dot16_scaled(_mm_or_si128(_mm_and_si128(l2, m4), _mm_and_si128(_mm_slli_epi16(h0, 2), m2)), v + 32, bcast16(sc, 2)));
            si = _mm_add_epi32(si, dot16_scaled(_mm_or_si128(_mm_and_si128(l3, m4), _mm_and_si128(_mm_slli_epi16(h1, 2), m2)), v + 48, bcast16(sc, 3)));
            si = _mm_add_epi32(si, dot16_scaled(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(l0, 4), m4), _mm_and_si128(h0, m2)), v + 64, bcast16(sc, 4)));
            si = _mm_add_epi32(si, dot16_scaled(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(l1, 4), m4), _mm_and_si128(h1, m2)), v + 80, bcast16(sc, 5)));
            si = _mm_add_epi32(si, dot16_scaled(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(l2, 4), m4),
                                                             _mm_and_si128(_mm_srli_epi16(h0, 2), m2)), v + 96, bcast16(sc, 6)));
            si = _mm_add_epi32(si, dot16_scaled(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(l3, 4), m4),
                                                             _mm_and_si128(_mm_srli_epi16(h1, 2), m2)), v + 112, bcast16(sc, 7)));
        }
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(si), _mm_set1_ps(fm_half(x[b].d) * y[b].d)));
    }
    return hsum128_ps(acc);
}
