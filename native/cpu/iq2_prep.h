/* The per-block unpacking of the 2-bit i-quants (IQ2_XXS, IQ2_XS, IQ2_S) shared by their SIMD
 * kernels (iq2_row_ssse3.c, iq2_batch_avx2.c, iq2_batch_avx512.c), in SSSE3 instructions: a
 * block's 32 grid indices, 32 sign bytes and 16 scales, from which the kernels gather the grid
 * entries and expand the signs sub-block by sub-block. Unpacking the whole block in 128-bit
 * registers takes a few instructions per field where the kernels' sub-block loop would take
 * scalar shifts and table lookups per entry. Include only from files built with SSSE3 or wider. */
#ifndef FERMIUM_IQ2_PREP_H
#define FERMIUM_IQ2_PREP_H
#include <tmmintrin.h>
#include "quants.h"
#include "../iq_tables.h"

typedef struct {
    uint16_t idx[32];       // grid index of values 8k..8k+7
    uint8_t signs[32];      // their signs, bit j for value 8k + j (the sign bits of the block, in order)
    int16_t scales[16];     // 2 * scale + 1 of values 0..15 (lanes 0..7, one per sub-block), of 16..31 (8..15)
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
    IQ2_STORE(p->scales, _mm_add_epi16(_mm_add_epi16(lo, lo), one));
    IQ2_STORE(p->scales + 8, _mm_add_epi16(_mm_add_epi16(hi, hi), one));
}

// IQ2_XXS: each sub-block is a word of 4 index bytes and a word of 4 x 7 sign bits and the scale
static inline __attribute__((always_inline)) void iq2_xxs_prep(const void *block, iq2_prep *p) {
    const block_iq2_xxs *x = block;
    const __m128i idx = _mm_setr_epi8(0, -1, 1, -1, 2, -1, 3, -1, 8, -1, 9, -1, 10, -1, 11, -1);
    __m128i q[4];
    for (int k = 0; k < 4; k++) {
        q[k] = IQ2_LOAD(x->qs + 8 * k);   // sub-blocks 2k, 2k+1
        IQ2_STORE(p->idx + 8 * k, _mm_shuffle_epi8(q[k], idx));
    }
    __m128i w[2], sc[2];
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
    IQ2_STORE(p->scales, s);
    IQ2_STORE(p->scales + 8, s);
}

// IQ2_XS: 16-bit entries of a 9-bit index and a 7-bit sign index
static inline __attribute__((always_inline)) void iq2_xs_prep(const void *block, iq2_prep *p) {
    const block_iq2_xs *x = block;
    const __m128i m9 = _mm_set1_epi16(511);
    for (int h = 0; h < 2; h++) {
        const __m128i a = IQ2_LOAD(x->qs + 16 * h), b = IQ2_LOAD(x->qs + 16 * h + 8);
        IQ2_STORE(p->idx + 16 * h, _mm_and_si128(a, m9));
        IQ2_STORE(p->idx + 16 * h + 8, _mm_and_si128(b, m9));
        IQ2_STORE(p->signs + 16 * h, iq2_ksigns(_mm_packus_epi16(_mm_srli_epi16(a, 9), _mm_srli_epi16(b, 9))));
    }
    iq2_nibble_scales(x->scales, p);
}

// IQ2_S: the low 8 bits of the indices in qs, 2 more per entry in qh (entry l of sub-block ib:
// bits 2l, 2l+1 of qh[ib]); the sign bytes as stored
static inline __attribute__((always_inline)) void iq2_s_prep(const void *block, iq2_prep *p) {
    const block_iq2_s *x = block;
    const __m128i qh = _mm_loadl_epi64((const __m128i *)x->qh), z = _mm_setzero_si128();
    const __m128i mask = _mm_setr_epi16(3, 12, 48, 192, 3, 12, 48, 192);
    const __m128i mul = _mm_setr_epi16(256, 64, 16, 4, 256, 64, 16, 4);   // bits 2l, 2l+1 up to 8, 9
    for (int h = 0; h < 2; h++) {
        const __m128i lo8 = IQ2_LOAD(x->qs + 16 * h);
        for (int k = 0; k < 2; k++) {    // entries 16h + 8k.., sub-blocks ib = 4h + 2k and ib + 1
            const char ib = (char)(4 * h + 2 * k);
            const __m128i rep = _mm_setr_epi8(ib, -1, ib, -1, ib, -1, ib, -1, ib + 1, -1, ib + 1, -1, ib + 1, -1, ib + 1, -1);
            const __m128i high = _mm_mullo_epi16(_mm_and_si128(_mm_shuffle_epi8(qh, rep), mask), mul);
            const __m128i low = k ? _mm_unpackhi_epi8(lo8, z) : _mm_unpacklo_epi8(lo8, z);
            IQ2_STORE(p->idx + 16 * h + 8 * k, _mm_or_si128(low, high));
        }
        IQ2_STORE(p->signs + 16 * h, IQ2_LOAD(x->qs + QK_K / 8 + 16 * h));
    }
    iq2_nibble_scales(x->scales, p);
}

// a block's unpacking, and its d (the first field of each of the three)
typedef void (*iq2_prep_fn)(const void *block, iq2_prep *p);
static inline __attribute__((always_inline)) fm_f16 iq2_d(const void *block) { return *(const fm_f16 *)block; }

#undef IQ2_LOAD
#undef IQ2_STORE
#endif
