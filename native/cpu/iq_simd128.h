/* The grid indices of whole IQ3_S, IQ1_S and IQ1_M super-blocks (iq_lowbit.h) and their
 * sub-block scales, computed in 128-bit registers; the indices stored as uint16, from which the
 * kernels load each entry's address: two loads per entry, where decoding one index in general
 * registers took five to seven instructions. SSSE3 only: shared by the SSSE3, AVX2 and AVX-512
 * kernels. */
#ifndef FERMIUM_IQ_SIMD128_H
#define FERMIUM_IQ_SIMD128_H
#include <tmmintrin.h>
#include "iq_lowbit.h"

#define IQ_LOAD128(p) _mm_loadu_si128((const __m128i *)(p))
#define IQ_STORE128(p, v) _mm_storeu_si128((__m128i *)(p), v)
// the indices read back from memory, one load each: left to itself, the compiler moves each one
// out of its register by `pextrw`, two micro-operations
#define IQ_INDICES_IN_MEMORY(idx) __asm__ volatile("" : : "r"(idx) : "memory")

// pshufb patterns: bytes 2m and 2m+1 (8 copies each) of a vector of IQ3_S's qh, for the 16
// entries of sub-blocks 2m, 2m+1; then the bit that each entry's byte tests
static const uint8_t IQ3S_QH_SPREAD[4][16] __attribute__((aligned(16))) = {
    { 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1 }, { 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3 },
    { 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5 }, { 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7 } };
static const uint8_t IQ_BIT_OF_BYTE[16] __attribute__((aligned(16))) = {
    1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128 };

// the 64 9-bit indices of an IQ3_S block: qs with the entry's qh bit as the high byte
IQ_INLINE void iq3s_indices(const block_iq3_s *x, uint16_t idx[64]) {
    const __m128i qh = _mm_loadl_epi64((const __m128i *)x->qh), one = _mm_set1_epi8(1);
    const __m128i bits = _mm_load_si128((const __m128i *)IQ_BIT_OF_BYTE);
    _Pragma("GCC unroll 4")
    for (int m = 0; m < 4; m++) {
        const __m128i spread = _mm_shuffle_epi8(qh, _mm_load_si128((const __m128i *)IQ3S_QH_SPREAD[m]));
        const __m128i hb = _mm_min_epu8(_mm_and_si128(spread, bits), one);
        const __m128i q = IQ_LOAD128(x->qs + 16 * m);
        IQ_STORE128(idx + 16 * m, _mm_unpacklo_epi8(q, hb));
        IQ_STORE128(idx + 16 * m + 8, _mm_unpackhi_epi8(q, hb));
    }
}

// the 8 IQ3_S sub-block scales ls = 2 s + 1 as int16, from the block's 4 bytes of nibbles
IQ_INLINE __m128i iq3s_scales(const block_iq3_s *x) {
    uint32_t packed;
    __builtin_memcpy(&packed, x->scales, 4);
    const __m128i v = _mm_cvtsi32_si128((int)packed), m4 = _mm_set1_epi8(0xF);
    const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    return _mm_unpacklo_epi8(_mm_or_si128(_mm_add_epi8(nib, nib), _mm_set1_epi8(1)), _mm_setzero_si128());
}

// the 8 IQ1_S sub-block scales ls = 2 s + 1 as int16: bits 12..14 of each qh word
IQ_INLINE __m128i iq1s_scales(const block_iq1_s *x) {
    const __m128i qh = IQ_LOAD128(x->qh);
    return _mm_or_si128(_mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7)), 1), _mm_set1_epi16(1));
}

// the 32 12-bit indices of an IQ1_M block: qs with the entry's nibble of qh as the high byte
IQ_INLINE void iq1m_indices(const block_iq1_m *x, uint16_t idx[32]) {
    const __m128i qh = IQ_LOAD128(x->qh), m4 = _mm_set1_epi8(0xF);
    const __m128i lo = _mm_and_si128(qh, m4), hi = _mm_and_si128(_mm_srli_epi16(qh, 4), m4);
    const __m128i n0 = _mm_unpacklo_epi8(lo, hi), n1 = _mm_unpackhi_epi8(lo, hi);
    const __m128i q0 = IQ_LOAD128(x->qs), q1 = IQ_LOAD128(x->qs + 16);
    IQ_STORE128(idx, _mm_unpacklo_epi8(q0, n0));
    IQ_STORE128(idx + 8, _mm_unpackhi_epi8(q0, n0));
    IQ_STORE128(idx + 16, _mm_unpacklo_epi8(q1, n1));
    IQ_STORE128(idx + 24, _mm_unpackhi_epi8(q1, n1));
}

// pshufb patterns: IQ1_S's qh words 2m and 2m+1, 4 copies each
static const uint8_t IQ1S_QH_SPREAD[4][16] __attribute__((aligned(16))) = {
#define W(k) 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1, 2 * (k), 2 * (k) + 1
    { W(0), W(1) }, { W(2), W(3) }, { W(4), W(5) }, { W(6), W(7) },
#undef W
};

// the 32 12-bit indices of an IQ1_S block: per 8 entries (two sub-blocks), their qh words 4
// times each, multiplied so that field l lands in bits 13..15, moved to bits 8..10; bit 15 (the
// delta sign) to bit 11
IQ_INLINE void iq1s_indices(const block_iq1_s *x, uint16_t idx[32]) {
    const __m128i qh = IQ_LOAD128(x->qh);
    const __m128i mul = _mm_setr_epi16(8192, 1024, 128, 16, 8192, 1024, 128, 16);
    const __m128i high = _mm_set1_epi16(0x0700), sign = _mm_set1_epi16(0x0800), zero = _mm_setzero_si128();
    _Pragma("GCC unroll 4")
    for (int m = 0; m < 4; m++) {
        const __m128i w = _mm_shuffle_epi8(qh, _mm_load_si128((const __m128i *)IQ1S_QH_SPREAD[m]));
        const __m128i h = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(_mm_mullo_epi16(w, mul), 5), high),
                                       _mm_and_si128(_mm_srli_epi16(w, 4), sign));
        const __m128i q = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(x->qs + 8 * m)), zero);
        IQ_STORE128(idx + 8 * m, _mm_or_si128(q, h));
    }
}

// the 16 IQ1_M scales ls = 2 s + 1 (iq_lowbit.h): lo8 those of values 0..127, hi8 of 128..255
IQ_INLINE void iq1m_scales(const block_iq1_m *x, __m128i *lo8, __m128i *hi8) {
    const __m128i w = _mm_loadl_epi64((const __m128i *)x->scales);
    // each uint16 4 times, multiplied so that its field t % 4 lands in bits 13..15
    const __m128i mul = _mm_setr_epi16(8192, 1024, 128, 16, 8192, 1024, 128, 16);
    const __m128i one = _mm_set1_epi16(1);
    const __m128i w01 = _mm_shuffle_epi8(w, _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3));
    const __m128i w23 = _mm_shuffle_epi8(w, _mm_setr_epi8(4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7));
    *lo8 = _mm_or_si128(_mm_slli_epi16(_mm_srli_epi16(_mm_mullo_epi16(w01, mul), 13), 1), one);
    *hi8 = _mm_or_si128(_mm_slli_epi16(_mm_srli_epi16(_mm_mullo_epi16(w23, mul), 13), 1), one);
}

#endif
