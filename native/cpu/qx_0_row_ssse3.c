/* SSSE3 dot products of 32-value blocks (Q4_0, Q8_0) with 8-bit activations: `pmaddubsw` on
 * unsigned nibbles (Q4_0, the offset of 8 taken out through the activation sums) or on |w|
 * and sign(w)*a (Q8_0). Block scales are converted four at a time in vector registers.
 * Built with -mssse3 only; must hold no AVX instruction. */
#include <tmmintrin.h>
#include "quants.h"
#include "simd128.h"

#define LANE(v, k) _mm_shuffle_ps((v), (v), _MM_SHUFFLE(k, k, k, k))

// 16 bytes of nibbles . 32 activations (unsigned low nibbles, then high) -> 4 float
static inline __m128 dot_u4(const uint8_t *qs, const int8_t *a) {
    const __m128i m4 = _mm_set1_epi8(0xF), q = _mm_loadu_si128((const __m128i *)qs);
    __m128i p = _mm_add_epi16(_mm_maddubs_epi16(_mm_and_si128(q, m4), _mm_loadu_si128((const __m128i *)a)),
                              _mm_maddubs_epi16(_mm_and_si128(_mm_srli_epi16(q, 4), m4),
                                                _mm_loadu_si128((const __m128i *)(a + 16))));
    return _mm_cvtepi32_ps(_mm_madd_epi16(p, _mm_set1_epi16(1)));
}

// 32 signed weights . 32 activations -> 4 float
static inline __m128 dot_i8(const int8_t *w, const int8_t *a) {
    __m128i acc = _mm_setzero_si128();
    for (int h = 0; h < 2; h++) {
        const __m128i x = _mm_loadu_si128((const __m128i *)(w + 16 * h));
        const __m128i p = _mm_maddubs_epi16(_mm_sign_epi8(x, x),
                                            _mm_sign_epi8(_mm_loadu_si128((const __m128i *)(a + 16 * h)), x));
        acc = _mm_add_epi32(acc, _mm_madd_epi16(p, _mm_set1_epi16(1)));
    }
    return _mm_cvtepi32_ps(acc);
}

// the int16 pair sums of 16 bytes of nibbles . 32 activations (low nibbles, then high); the
// activations 16-byte aligned (quants.h), so they are `pmaddubsw` memory operands, not loads
static inline __m128i dot_u4_i16(const uint8_t *qs, const int8_t *a) {
    const __m128i m4 = _mm_set1_epi8(0xF), q = _mm_loadu_si128((const __m128i *)qs);
    return _mm_add_epi16(_mm_maddubs_epi16(_mm_and_si128(q, m4), _mm_load_si128((const __m128i *)a)),
                         _mm_maddubs_epi16(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_load_si128((const __m128i *)(a + 16))));
}

// the lane sums of four blocks' int16 pair sums (each at most 7680, dot_u4_i16), block k in
// lane k: pairs added by `pmaddwd` and narrowed back by `packssdw`, exact while a sum stays
// below 32768 (4 lanes: 30720). 10 single-cycle operations in place of two `phaddw`, a `phaddd`
// (3 micro-operations each) and two `pmaddwd`, in a row kernel bound by its instructions
static inline __m128i sum4_blocks(__m128i p0, __m128i p1, __m128i p2, __m128i p3) {
    const __m128i ones = _mm_set1_epi16(1);
    const __m128i q01 = _mm_packs_epi32(_mm_madd_epi16(p0, ones), _mm_madd_epi16(p1, ones));   // 2 blocks x 4
    const __m128i q23 = _mm_packs_epi32(_mm_madd_epi16(p2, ones), _mm_madd_epi16(p3, ones));
    const __m128i r = _mm_packs_epi32(_mm_madd_epi16(q01, ones), _mm_madd_epi16(q23, ones));   // 4 blocks x 2
    return _mm_madd_epi16(r, ones);
}

// sum_b dw*dy*sum(u*q) - 8 * sum_b dw*(dy*sum(q)): the stored nibbles are offset by 8. Four
// blocks' int16 sums are reduced to one int32 each (lane b), so one convert and one multiply
// apply four block scales. Bounds: a pair sum is at most 2 * 2 * 15 * 128 = 7680, two of them 15360.
float fm_dot_q4_0_a8_ssse3(int n, const void *w, const void *a) {
    const block_q4_0 *x = w;
    const int nb = n / QK32;
    const int8_t *q = a;
    const float *dy = fm_a32_d(a, nb), *sy = fm_a32_s(a, nb);
    __m128 acc = _mm_setzero_ps(), off = _mm_setzero_ps();
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        fm_prefetch_ahead(x + b, 4 * sizeof *x);
        const __m128 dw = half4_gathered((const uint8_t *)&x[b].d, sizeof *x);
        off = _mm_add_ps(off, _mm_mul_ps(dw, _mm_loadu_ps(sy + b)));
        const __m128i s = sum4_blocks(dot_u4_i16(x[b].qs, q + QK32 * b), dot_u4_i16(x[b + 1].qs, q + QK32 * (b + 1)),
                                      dot_u4_i16(x[b + 2].qs, q + QK32 * (b + 2)), dot_u4_i16(x[b + 3].qs, q + QK32 * (b + 3)));
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(s), _mm_mul_ps(dw, _mm_loadu_ps(dy + b))));
    }
    float sum = hsum128_ps(acc) - 8.0f * hsum128_ps(off);
    for (; b < nb; b++) {
        const float dw = fm_half(x[b].d);
        sum += dw * (dy[b] * hsum128_ps(dot_u4(x[b].qs, q + QK32 * b)) - 8.0f * sy[b]);
    }
    return sum;
}

// Q4_0p (quants.h): per group of 4 blocks, the 8 `pmaddubsw` products and the activations'
// offset corrections add up as int16 (lanes 2m, 2m+1 hold block m) and one `pmaddwd` leaves the
// 4 block sums, where the GGUF layout takes 10 operations (sum4_blocks); the 4 scales are one
// 8-byte load. It streams faster than the GGUF-layout kernel, and the corrections, in place of a
// multiply-add of the block sums per group, faster still, most on short rows (the experts' down
// matrices; docs/performance.md)
float fm_dot_q4_0p_a8_ssse3(int n, const void *w, const void *a) {
    const block_q4_0p *x = w;
    const int nb = n / QK32;
    const int8_t *q = a;
    const float *dy = fm_a32_d(a, nb);
    const int16_t *corr = fm_q4_0p_offsets(a, nb);
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m128 acc = _mm_setzero_ps();
    for (int g = 0; g < n / QK_Q4_0P; g++, q += QK_Q4_0P, corr += 8) {
        fm_prefetch_ahead(x + g, sizeof *x);
        const __m128 dw = half4_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)x[g].d)));
        __m128i p = _mm_load_si128((const __m128i *)corr);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)x[g].qs[j]);
            p = _mm_add_epi16(p, _mm_maddubs_epi16(_mm_and_si128(v, m4), _mm_load_si128((const __m128i *)(q + 32 * j))));
            p = _mm_add_epi16(p, _mm_maddubs_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m4),
                                                   _mm_load_si128((const __m128i *)(q + 32 * j + 16))));
        }
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(_mm_madd_epi16(p, _mm_set1_epi16(1))),
                                         _mm_mul_ps(dw, _mm_loadu_ps(dy + 4 * g))));
    }
    return hsum128_ps(acc);
}

float fm_dot_q8_0_a8_ssse3(int n, const void *w, const void *a) {
    const block_q8_0 *x = w;
    const int nb = n / QK32;
    const int8_t *q = a;
    const float *dy = fm_a32_d(a, nb);
    __m128 acc0 = _mm_setzero_ps(), acc1 = _mm_setzero_ps();
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        fm_prefetch_ahead(x + b, 4 * sizeof *x);
        const __m128 dd = _mm_mul_ps(half4_gathered((const uint8_t *)&x[b].d, sizeof *x), _mm_loadu_ps(dy + b));
        acc0 = _mm_add_ps(acc0, _mm_mul_ps(dot_i8(x[b].qs, q + QK32 * b), LANE(dd, 0)));
        acc1 = _mm_add_ps(acc1, _mm_mul_ps(dot_i8(x[b + 1].qs, q + QK32 * (b + 1)), LANE(dd, 1)));
        acc0 = _mm_add_ps(acc0, _mm_mul_ps(dot_i8(x[b + 2].qs, q + QK32 * (b + 2)), LANE(dd, 2)));
        acc1 = _mm_add_ps(acc1, _mm_mul_ps(dot_i8(x[b + 3].qs, q + QK32 * (b + 3)), LANE(dd, 3)));
    }
    float sum = hsum128_ps(_mm_add_ps(acc0, acc1));
    for (; b < nb; b++) sum += fm_half(x[b].d) * dy[b] * hsum128_ps(dot_i8(x[b].qs, q + QK32 * b));
    return sum;
}
