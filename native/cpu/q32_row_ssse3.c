/* SSSE3 dot products of the other 32-value block types (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) with
 * 8-bit activations, four blocks a step: each block's `pmaddubsw` products are reduced to one
 * int32 per block (lane k of a vector for block k), so one convert and one multiply apply four
 * block scales. The block sums and their c * s terms as in q32_batch_avx2.c: unsigned bytes u
 * (the code plus an offset for Q5_0 and MXFP4) against the activations, IQ4_NL's signed code
 * book as |u| . sign(q, u). Built with -mssse3 only; must hold no AVX instruction. */
#include <tmmintrin.h>
#include "quants.h"
#include "simd128.h"
#include "../iq_tables.h"

#define INLINE static inline __attribute__((always_inline))
#define ALOAD(p) _mm_load_si128((const __m128i *)(p))   // activations: 16-byte aligned (quants.h)
#define MXFP4_OFFSET 12

// the two halves of a block: values 0..15 (low nibbles) and 16..31 (high nibbles)
typedef struct { __m128i lo, hi; } halves;

INLINE halves nibbles(const uint8_t *qs) {
    const __m128i m4 = _mm_set1_epi8(0xF), q = _mm_loadu_si128((const __m128i *)qs);
    return (halves){ _mm_and_si128(q, m4), _mm_and_si128(_mm_srli_epi16(q, 4), m4) };
}

// bit j of qh as 0x10 in byte j, ORed into the halves
INLINE halves with_fifth_bits(halves v, const uint8_t *qh) {
    const __m128i bit = _mm_set1_epi64x((long long)0x8040201008040201ull), five = _mm_set1_epi8(0x10);
    uint32_t h;
    __builtin_memcpy(&h, qh, 4);
    const __m128i all = _mm_cvtsi32_si128((int)h);
    const __m128i lo = _mm_and_si128(_mm_shuffle_epi8(all, _mm_set_epi64x(0x0101010101010101, 0)), bit);
    const __m128i hi = _mm_and_si128(_mm_shuffle_epi8(all, _mm_set_epi64x(0x0303030303030303, 0x0202020202020202)), bit);
    v.lo = _mm_or_si128(v.lo, _mm_and_si128(_mm_cmpeq_epi8(lo, bit), five));
    v.hi = _mm_or_si128(v.hi, _mm_and_si128(_mm_cmpeq_epi8(hi, bit), five));
    return v;
}

// unsigned bytes . 32 activations: the int16 pair sums of both halves added (each lane at most
// 2 * 2 * 31 * 127 = 15748 for the 5-bit codes, 12192 for MXFP4's offset ones)
INLINE __m128i udot16(halves u, const int8_t *a) {
    return _mm_add_epi16(_mm_maddubs_epi16(u.lo, ALOAD(a)), _mm_maddubs_epi16(u.hi, ALOAD(a + 16)));
}

// four blocks' int16 pair sums (each lane below 16384, udot16) -> one int32 per block: pairs
// summed by `pmaddwd` (below 32768) and narrowed by `packssdw`, summed again and once `phaddd`
INLINE __m128i sum4_u(__m128i p0, __m128i p1, __m128i p2, __m128i p3) {
    const __m128i ones = _mm_set1_epi16(1);
    const __m128i q01 = _mm_packs_epi32(_mm_madd_epi16(p0, ones), _mm_madd_epi16(p1, ones));
    const __m128i q23 = _mm_packs_epi32(_mm_madd_epi16(p2, ones), _mm_madd_epi16(p3, ones));
    return _mm_hadd_epi32(_mm_madd_epi16(q01, ones), _mm_madd_epi16(q23, ones));
}

// signed bytes . 32 activations as 4 int32: |v| . sign(a, v), each half's int16 pairs (at most
// 2 * 127 * 127) widened before they add
INLINE __m128i sdot32(halves v, const int8_t *a) {
    const __m128i ones = _mm_set1_epi16(1);
    const __m128i lo = _mm_maddubs_epi16(_mm_sign_epi8(v.lo, v.lo), _mm_sign_epi8(ALOAD(a), v.lo));
    const __m128i hi = _mm_maddubs_epi16(_mm_sign_epi8(v.hi, v.hi), _mm_sign_epi8(ALOAD(a + 16), v.hi));
    return _mm_add_epi32(_mm_madd_epi16(lo, ones), _mm_madd_epi16(hi, ones));
}

INLINE __m128i sum4_i32(__m128i p0, __m128i p1, __m128i p2, __m128i p3) {
    return _mm_hadd_epi32(_mm_hadd_epi32(p0, p1), _mm_hadd_epi32(p2, p3));
}

INLINE halves booked(halves v, __m128i book) {
    return (halves){ _mm_shuffle_epi8(book, v.lo), _mm_shuffle_epi8(book, v.hi) };
}

// ---- per type: the integer sums of blocks x[0..3] against q (one lane each), of one block (the
// tail, as 4 partial sums), the 4 scales dw and their c, and one block's dw and c

#define U4(T, unpack) \
    INLINE __m128i T##_sum4(const block_##T *x, const int8_t *q, __m128i book) { \
        (void)book; \
        return sum4_u(udot16(unpack(x), q), udot16(unpack(x + 1), q + 32), udot16(unpack(x + 2), q + 64), \
                      udot16(unpack(x + 3), q + 96)); \
    } \
    INLINE __m128i T##_sum1(const block_##T *x, const int8_t *q, __m128i book) { \
        (void)book; \
        return _mm_madd_epi16(udot16(unpack(x), q), _mm_set1_epi16(1)); \
    }

INLINE halves q4_1_unpack(const block_q4_1 *x) { return nibbles(x->qs); }
INLINE halves q5_0_unpack(const block_q5_0 *x) { return with_fifth_bits(nibbles(x->qs), x->qh); }
INLINE halves q5_1_unpack(const block_q5_1 *x) { return with_fifth_bits(nibbles(x->qs), x->qh); }
U4(q4_1, q4_1_unpack)
U4(q5_0, q5_0_unpack)
U4(q5_1, q5_1_unpack)

INLINE __m128i mxfp4_sum4(const block_mxfp4 *x, const int8_t *q, __m128i book) {
    return sum4_u(udot16(booked(nibbles(x[0].qs), book), q), udot16(booked(nibbles(x[1].qs), book), q + 32),
                  udot16(booked(nibbles(x[2].qs), book), q + 64), udot16(booked(nibbles(x[3].qs), book), q + 96));
}
INLINE __m128i mxfp4_sum1(const block_mxfp4 *x, const int8_t *q, __m128i book) {
    return _mm_madd_epi16(udot16(booked(nibbles(x->qs), book), q), _mm_set1_epi16(1));
}
INLINE __m128i iq4_nl_sum4(const block_iq4_nl *x, const int8_t *q, __m128i book) {
    return sum4_i32(sdot32(booked(nibbles(x[0].qs), book), q), sdot32(booked(nibbles(x[1].qs), book), q + 32),
                    sdot32(booked(nibbles(x[2].qs), book), q + 64), sdot32(booked(nibbles(x[3].qs), book), q + 96));
}
INLINE __m128i iq4_nl_sum1(const block_iq4_nl *x, const int8_t *q, __m128i book) {
    return sdot32(booked(nibbles(x->qs), book), q);
}

#define F16_AT(x, field) half4_gathered((const uint8_t *)&(x)->field, sizeof *(x))
INLINE __m128 q4_1_dw(const block_q4_1 *x) { return F16_AT(x, d); }
INLINE __m128 q4_1_c(const block_q4_1 *x, __m128 dw) { (void)dw; return F16_AT(x, m); }
INLINE float q4_1_dw1(const block_q4_1 *x) { return fm_half(x->d); }
INLINE float q4_1_c1(const block_q4_1 *x) { return fm_half(x->m); }
INLINE __m128 q5_0_dw(const block_q5_0 *x) { return F16_AT(x, d); }
INLINE __m128 q5_0_c(const block_q5_0 *x, __m128 dw) { (void)x; return _mm_mul_ps(dw, _mm_set1_ps(-16.0f)); }
INLINE float q5_0_dw1(const block_q5_0 *x) { return fm_half(x->d); }
INLINE float q5_0_c1(const block_q5_0 *x) { return -16.0f * fm_half(x->d); }
INLINE __m128 q5_1_dw(const block_q5_1 *x) { return F16_AT(x, d); }
INLINE __m128 q5_1_c(const block_q5_1 *x, __m128 dw) { (void)dw; return F16_AT(x, m); }
INLINE float q5_1_dw1(const block_q5_1 *x) { return fm_half(x->d); }
INLINE float q5_1_c1(const block_q5_1 *x) { return fm_half(x->m); }
INLINE __m128 iq4_nl_dw(const block_iq4_nl *x) { return F16_AT(x, d); }
INLINE __m128 iq4_nl_c(const block_iq4_nl *x, __m128 dw) { (void)x; return dw; }   // unused: no c
INLINE float iq4_nl_dw1(const block_iq4_nl *x) { return fm_half(x->d); }
INLINE float iq4_nl_c1(const block_iq4_nl *x) { (void)x; return 0.0f; }

// twice the 4 scales, 2^(e - 127): the bits e << 23, and 2^-127 (0x00400000) for e = 0
// (q32_batch_avx2.c: the halving goes into da)
INLINE __m128 mxfp4_dw(const block_mxfp4 *x) {
    const uint32_t e = x[0].e | (uint32_t)x[1].e << 8 | (uint32_t)x[2].e << 16 | (uint32_t)x[3].e << 24;
    const __m128i zero = _mm_setzero_si128();
    const __m128i e32 = _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128((int)e), zero), zero);
    const __m128i low = _mm_and_si128(_mm_cmpeq_epi32(e32, zero), _mm_set1_epi32(0x00400000));
    return _mm_castsi128_ps(_mm_or_si128(_mm_slli_epi32(e32, 23), low));
}
INLINE __m128 mxfp4_c(const block_mxfp4 *x, __m128 dw) { (void)x; return _mm_mul_ps(dw, _mm_set1_ps(-0.5f * MXFP4_OFFSET)); }
INLINE float mxfp4_dw1(const block_mxfp4 *x) { return fm_e8m0_half(x->e); }
INLINE float mxfp4_c1(const block_mxfp4 *x) { return -(float)MXFP4_OFFSET * fm_e8m0_half(x->e); }

INLINE __m128i book128(const int8_t *values, int offset) {
    return _mm_add_epi8(_mm_loadu_si128((const __m128i *)values), _mm_set1_epi8((char)offset));
}

// T, HALF, HAS_C and BOOK as in q32_batch_avx2.c
#define Q32_ROW(T, HALF, HAS_C, BOOK)                                                                   \
    float fm_dot_##T##_a8_ssse3(int n, const void *w, const void *a) {                                  \
        const block_##T *x = w;                                                                          \
        const int nb = n / QK32;                                                                         \
        const int8_t *q = a;                                                                             \
        const float *dy = fm_a32_d(a, nb), *sy = fm_a32_s(a, nb);                                        \
        const __m128i book = BOOK;                                                                       \
        __m128 acc = _mm_setzero_ps(), off = _mm_setzero_ps();                                           \
        int b = 0;                                                                                       \
        for (; b + 4 <= nb; b += 4) {                                                                    \
            fm_prefetch_ahead(x + b, 4 * sizeof *x);                                                     \
            const __m128 dw = T##_dw(x + b), da = _mm_loadu_ps(dy + b);                                  \
            if (HAS_C) off = _mm_add_ps(off, _mm_mul_ps(T##_c(x + b, dw), _mm_loadu_ps(sy + b)));        \
            const __m128i s = T##_sum4(x + b, q + QK32 * b, book);                                       \
            acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(s),                                         \
                                             _mm_mul_ps(dw, HALF == 1.0f ? da : _mm_mul_ps(da, _mm_set1_ps(HALF))))); \
        }                                                                                                \
        float sum = hsum128_ps(acc) + (HAS_C ? hsum128_ps(off) : 0.0f);                                  \
        for (; b < nb; b++) {                                                                            \
            const float dot = hsum128_ps(_mm_cvtepi32_ps(T##_sum1(x + b, q + QK32 * b, book)));          \
            sum += T##_dw1(x + b) * dy[b] * dot + (HAS_C ? T##_c1(x + b) * sy[b] : 0.0f);                \
        }                                                                                                \
        return sum;                                                                                      \
    }

Q32_ROW(q4_1, 1.0f, 1, _mm_setzero_si128())
Q32_ROW(q5_0, 1.0f, 1, _mm_setzero_si128())
Q32_ROW(q5_1, 1.0f, 1, _mm_setzero_si128())
Q32_ROW(iq4_nl, 1.0f, 0, book128(fm_kvalues_iq4nl, 0))
Q32_ROW(mxfp4, 0.5f, 1, book128(fm_kvalues_mxfp4, MXFP4_OFFSET))
