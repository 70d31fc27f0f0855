/* Decoding of the 3- and 1-bit i-quants (IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) shared by every ISA's
 * kernels: grid indices, sign words, scales. Each kernel sums, per super-block, the exact integer
 *   IQ3_XXS, IQ3_S:  sum_j ls_j * sum_v grid_v * sign_v * a_v             (value = d * ls * grid / 4 resp. / 1)
 *   IQ1_S, IQ1_M:    sum_t ls_t * sum_v (8 grid_v + delta_v) * a_v        (value = d * ls * (grid + delta / 8))
 * with delta_v = -1 or +1, and scales it once by the block's float scale (fm_iq_block_scale):
 * the same integer and the same float operations in every ISA, so all of them give the generic
 * kernel's bits. */
#ifndef FERMIUM_IQ_LOWBIT_H
#define FERMIUM_IQ_LOWBIT_H
#include <stdint.h>
#include "quants.h"
#include "../iq_tables.h"

_Static_assert(sizeof(block_iq3_xxs) == 98 && sizeof(block_iq3_s) == 110, "GGUF IQ3 block sizes");
_Static_assert(sizeof(block_iq1_s) == 50 && sizeof(block_iq1_m) == 56, "GGUF IQ1 block sizes");

#define IQ_INLINE static inline __attribute__((always_inline))

// the super-block's float factor: d of the weights times d of the activations, times the
// power of two that the integer sum carries (1/4 for IQ3_XXS's (2s + 1) / 4, 1/8 for IQ1's deltas)
IQ_INLINE float fm_iq_block_scale(float dw, float da, float pow2) { return dw * da * pow2; }
#define FM_IQ3XXS_POW2 0.25f
#define FM_IQ3S_POW2 1.0f
#define FM_IQ1_POW2 0.125f

// IQ3_XXS: sub-block j (32 values) has 8 grid indices qs[8j..8j+7] (4 values each) and one
// word of scales_signs: 4 x 7 sign bits (values 8l..8l+7; the eighth sign is their parity,
// fm_ksigns_iq2xs) and the 4-bit scale s in bits 28..31, ls = 2s + 1
IQ_INLINE uint32_t fm_iq3xxs_aux(const block_iq3_xxs *x, int j) {
    uint32_t a;
    __builtin_memcpy(&a, x->scales_signs + 4 * j, 4);
    return a;
}
// bit v: value v of the sub-block is negative
IQ_INLINE uint32_t fm_iq3xxs_signs(uint32_t aux) {
    return (uint32_t)fm_ksigns_iq2xs[aux & 127] | (uint32_t)fm_ksigns_iq2xs[(aux >> 7) & 127] << 8
         | (uint32_t)fm_ksigns_iq2xs[(aux >> 14) & 127] << 16 | (uint32_t)fm_ksigns_iq2xs[(aux >> 21) & 127] << 24;
}

// IQ3_S: sub-block j has 8 9-bit grid indices (qs[8j + k], bit k of qh[j] on top), 32 sign bits
// (signs[4j..4j+3]) and a 4-bit scale (nibble j % 2 of scales[j / 2]), ls = 2s + 1
IQ_INLINE int fm_iq3s_index(const block_iq3_s *x, int j, int k) {
    return x->qs[8 * j + k] | ((x->qh[j] << (8 - k)) & 256);
}
IQ_INLINE uint32_t fm_iq3s_signs(const block_iq3_s *x, int j) {
    uint32_t s;
    __builtin_memcpy(&s, x->signs + 4 * j, 4);
    return s;
}
IQ_INLINE int fm_iq3s_ls(const block_iq3_s *x, int j) { return 2 * ((x->scales[j / 2] >> 4 * (j % 2)) & 15) + 1; }

// IQ1_S and IQ1_M entries are 8 values of fm_iq1s_grid (-1, 0, 1) and a delta sign; their index
// here has 12 bits: the grid's 11, and bit 11 set where the delta is negative.
// IQ1_S: sub-block j has entries qs[4j + l] with bits 3l..3l+2 of qh[j] on top, the delta sign in
// bit 15 of qh[j] and a 3-bit scale in bits 12..14, ls = 2s + 1 (for all 32 values)
IQ_INLINE int fm_iq1s_index(const block_iq1_s *x, int j, int l) {
    const int h = x->qh[j];
    return x->qs[4 * j + l] | ((h >> 3 * l) & 7) << 8 | (h >> 15) << 11;
}
IQ_INLINE int fm_iq1s_ls(const block_iq1_s *x, int j) { return 2 * ((x->qh[j] >> 12) & 7) + 1; }
// IQ1_M: entry e (0..31, values 8e..) is qs[e] with nibble e % 2 of qh[e / 2] on top (its bit 3
// the delta sign); a 3-bit scale per 16 values (t: bits 3 (t % 4).. of the t / 4-th uint16 of
// scales), ls = 2s + 1; the f16 d is spread over the top nibbles of those 4 uint16
IQ_INLINE int fm_iq1m_index(const block_iq1_m *x, int e) {
    return x->qs[e] | ((x->qh[e / 2] >> 4 * (e % 2)) & 15) << 8;
}
IQ_INLINE uint16_t fm_iq1m_word(const block_iq1_m *x, int i) {
    uint16_t w;
    __builtin_memcpy(&w, x->scales + 2 * i, 2);
    return w;
}
IQ_INLINE int fm_iq1m_ls(const block_iq1_m *x, int t) { return 2 * ((fm_iq1m_word(x, t / 4) >> 3 * (t % 4)) & 7) + 1; }
IQ_INLINE fm_f16 fm_iq1m_d(const block_iq1_m *x) {
    return (fm_f16)((fm_iq1m_word(x, 0) >> 12) | ((fm_iq1m_word(x, 1) >> 8) & 0x00F0)
                    | ((fm_iq1m_word(x, 2) >> 4) & 0x0F00) | (fm_iq1m_word(x, 3) & 0xF000));
}

// The SIMD kernels' IQ1 table, by 12-bit index: the 8 bytes 8 grid + delta + 16 (7 .. 25),
// unsigned for `pmaddubsw`. Its products are sum (8 grid + delta) a + 16 sum a; the kernels take
// the 16 sum a out through the activations' sums of each 16 (IQ1_M) or 32 (IQ1_S) values.
// Derived from fm_iq1s_grid when the library loads (iq1_row_generic.c).
extern uint64_t fm_iq1_grid8[4096];
#define FM_IQ1_GRID8_OFFSET 16   // the kernels take it out as a shift by 4 of the scaled sums

// The AVX-512 VBMI kernels' IQ3 grids as 3-bit codes (the rank of a value among the grid's 8),
// two a byte: codes[0][i] holds entry i's values 0 and 1 (bits 0..2, 4..6), codes[1][i] its
// values 2 and 3; 512 entries of IQ3_S, 256 of IQ3_XXS. Derived at load (iq3_row_generic.c).
extern uint8_t fm_iq3s_codes[2][512], fm_iq3xxs_codes[2][256];
// the value of each code: IQ3_S's are 2 c + 1, IQ3_XXS's these
#define FM_IQ3XXS_LEVELS { 4, 12, 20, 28, 36, 44, 52, 62 }

#endif
