/* The per-block unpacking of the 2-bit i-quants (IQ2_XXS, IQ2_XS, IQ2_S) shared by their SIMD
 * kernels (iq2_row_ssse3.c, iq2_batch_avx2.c, iq2_batch_avx512.c), in SSSE3 instructions: a
 * block's 32 sign bytes and 16 scales, from which the kernels expand the signs sub-block by
 * sub-block, and the grid index of each entry, read in scalar instructions. Unpacking the signs
 * of the whole block in 128-bit registers (the parity bit of IQ2_XXS's and IQ2_XS's sign
 * indices by two `pshufb`) takes a few instructions where a table lookup per entry would take
 * four. Include only from files built with SSSE3 or wider. */
#ifndef FERMIUM_IQ2_PREP_H
#define FERMIUM_IQ2_PREP_H
#include <stddef.h>
#include <tmmintrin.h>
#include "quants.h"
#include "../iq_tables.h"

typedef struct {
    uint8_t signs[32];      // their signs, bit j for value 8k + j (the sign bits of the block, in order)
    __m128i lo, hi;         // 2 * scale + 1 as int16, lane ib: of values 0..15, 16..31 of sub-block ib
} __attribute__((aligned(32))) iq2_prep;

#define IQ2_LOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define IQ2_STORE(p, v) _mm_store_si128((__m128i *)(p), v)

// s7 | parity(s7) << 7 for each byte: fm_ksigns_iq2xs[s7] (even count of negative values)
static inline __attribute__((always_inline)) __m128i iq2_ksigns(__m128i s7) {
    const __m128i parity = _mm_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0);
    const __m128i m4 = _mm_set1_epi8(15);
    const __m128i p = _mm_xor_si128(_mm_shuffle_epi8(parity, _mm_and_si128(s7, m4)),
                                    _mm_shuffle_epi8(parity, _mm_and_si128(_mm_srli_epi16(s7, 4), m4)));
    return _mm_or_si128(s7, p);
}

// the 4-bit scales of IQ2_XS and IQ2_S (low nibble: values 0..15 of a sub-block) as 2 s + 1
static inline __attribute__((always_inline)) void iq2_nibble_scales(const uint8_t *scales, iq2_prep *p) {
    const __m128i sc = _mm_loadl_epi64((const __m128i *)scales), m4 = _mm_set1_epi8(15), one = _mm_set1_epi16(1);
    const __m128i lo = _mm_unpacklo_epi8(_mm_and_si128(sc, m4), _mm_setzero_si128());
    const __m128i hi = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(sc, 4), m4), _mm_setzero_si128());
    p->lo = _mm_add_epi16(_mm_add_epi16(lo, lo), one);
    p->hi = _mm_add_epi16(_mm_add_epi16(hi, hi), one);
}

// IQ2_XXS: each sub-block is a word of 4 index bytes and a word of 4 x 7 sign bits and the scale
static inline __attribute__((always_inline)) void iq2_xxs_prep(const void *block, iq2_prep *p) {
    const block_iq2_xxs *x = block;
    __m128i q[4];
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; k++) q[k] = IQ2_LOAD(x->qs + 8 * k);   // sub-blocks 2k, 2k+1
    __m128i w[2], sc[2];
    _Pragma("GCC unroll 2")
    for (int h = 0; h < 2; h++) {        // the second words of sub-blocks 4h..4h+3
        w[h] = _mm_castps_si128(_mm_shuffle_ps(_mm_castsi128_ps(q[2 * h]), _mm_castsi128_ps(q[2 * h + 1]),
                                               _MM_SHUFFLE(3, 1, 3, 1)));
        sc[h] = _mm_srli_epi32(w[h], 28);
        // byte l of each word: sign index l, bits 7l..7l+6
        const __m128i s7 = _mm_or_si128(
            _mm_or_si128(_mm_and_si128(w[h], _mm_set1_epi32(0x7F)), _mm_and_si128(_mm_slli_epi32(w[h], 1), _mm_set1_epi32(0x7F00))),
            _mm_or_si128(_mm_and_si128(_mm_slli_epi32(w[h], 2), _mm_set1_epi32(0x7F0000)),
                         _mm_and_si128(_mm_slli_epi32(w[h], 3), _mm_set1_epi32(0x7F000000))));
        IQ2_STORE(p->signs + 16 * h, iq2_ksigns(s7));
    }
    const __m128i s16 = _mm_packs_epi32(sc[0], sc[1]);
    const __m128i s = _mm_add_epi16(_mm_add_epi16(s16, s16), _mm_set1_epi16(1));
    p->lo = p->hi = s;
}

// IQ2_XS: 16-bit entries of a 9-bit index and a 7-bit sign index
static inline __attribute__((always_inline)) void iq2_xs_prep(const void *block, iq2_prep *p) {
    const block_iq2_xs *x = block;
    _Pragma("GCC unroll 2")
    for (int h = 0; h < 2; h++) {
        const __m128i a = IQ2_LOAD(x->qs + 16 * h), b = IQ2_LOAD(x->qs + 16 * h + 8);
        IQ2_STORE(p->signs + 16 * h, iq2_ksigns(_mm_packus_epi16(_mm_srli_epi16(a, 9), _mm_srli_epi16(b, 9))));
    }
    iq2_nibble_scales(x->scales, p);
}

// IQ2_S: the sign bytes as stored
static inline __attribute__((always_inline)) void iq2_s_prep(const void *block, iq2_prep *p) {
    const block_iq2_s *x = block;
    IQ2_STORE(p->signs, IQ2_LOAD(x->qs + QK_K / 8));
    IQ2_STORE(p->signs + 16, IQ2_LOAD(x->qs + QK_K / 8 + 16));
    iq2_nibble_scales(x->scales, p);
}

// the grid index of entry k (values 8k..8k+7) of a block, in scalar instructions: the integer
// units are idle in these kernels, where unpacking the indices in vector registers and
// extracting them again would take a shuffle each
typedef uint32_t (*iq2_index_fn)(const uint8_t *block, const iq2_prep *p, int k);
static inline __attribute__((always_inline)) uint32_t iq2_xxs_index(const uint8_t *block, const iq2_prep *p, int k) {
    (void)p;
    return block[offsetof(block_iq2_xxs, qs) + 8 * (k / 4) + k % 4];
}
static inline __attribute__((always_inline)) uint32_t iq2_xs_index(const uint8_t *block, const iq2_prep *p, int k) {
    (void)p;
    return ((const block_iq2_xs *)block)->qs[k] & 511;
}
// IQ2_S: the top two index bits of the 4 entries of a sub-block, by its qh byte, in place (bits 8
// and 9): one load each, where shifting them out of qh took three instructions
#define IQ2S_HIGH(b) { ((b) & 3) << 8, ((b) >> 2 & 3) << 8, ((b) >> 4 & 3) << 8, ((b) >> 6 & 3) << 8 }
#define IQ2S_HIGH4(b) IQ2S_HIGH(b), IQ2S_HIGH((b) + 1), IQ2S_HIGH((b) + 2), IQ2S_HIGH((b) + 3)
#define IQ2S_HIGH16(b) IQ2S_HIGH4(b), IQ2S_HIGH4((b) + 4), IQ2S_HIGH4((b) + 8), IQ2S_HIGH4((b) + 12)
#define IQ2S_HIGH64(b) IQ2S_HIGH16(b), IQ2S_HIGH16((b) + 16), IQ2S_HIGH16((b) + 32), IQ2S_HIGH16((b) + 48)
static const uint16_t iq2s_high[256][4] = { IQ2S_HIGH64(0), IQ2S_HIGH64(64), IQ2S_HIGH64(128), IQ2S_HIGH64(192) };
#undef IQ2S_HIGH
#undef IQ2S_HIGH4
#undef IQ2S_HIGH16
#undef IQ2S_HIGH64
static inline __attribute__((always_inline)) uint32_t iq2_s_index(const uint8_t *block, const iq2_prep *p, int k) {
    (void)p;
    const block_iq2_s *x = (const block_iq2_s *)block;
    return x->qs[k] | iq2s_high[x->qh[k / 4]][k % 4];
}

// a block's unpacking, and its d (the first field of each of the three)
typedef void (*iq2_prep_fn)(const void *block, iq2_prep *p);
static inline __attribute__((always_inline)) fm_f16 iq2_d(const void *block) { return *(const fm_f16 *)block; }

#undef IQ2_LOAD
#undef IQ2_STORE
#endif
