/* Scalar pieces of the lower-bit super-blocks (Q2_K, Q3_K, IQ4_XS, TQ2_0, TQ1_0) shared by their
 * dot kernels (lowbit_*.c) and row dequantizers (quantize.c): the scale unpacking and the value
 * at each position, in the order GGML defines. */
#ifndef FERMIUM_LOWBIT_H
#define FERMIUM_LOWBIT_H
#include "quants.h"
#ifndef FM_IQ_TABLE
#define FM_IQ_TABLE static const __attribute__((unused))   // each includer uses some tables only
#endif
#include "../iq_tables.h"

// the 16 6-bit scales of a Q3_K super-block (0..63, the scale plus 32), byte i of the four words
// scale i: bytes 0..7 of `packed` hold the low 4 bits of scales 0..7 (low nibbles) and 8..15
// (high ones), bytes 8..11 the top 2 bits of scale 4i + k in bits 2i, 2i+1 of byte 8 + k
static inline void fm_q3k_scale_words(const uint8_t *packed, uint32_t w[4]) {
    uint32_t a0, a1, t;
    __builtin_memcpy(&a0, packed, 4);
    __builtin_memcpy(&a1, packed + 4, 4);
    __builtin_memcpy(&t, packed + 8, 4);
    const uint32_t m4 = 0x0F0F0F0Fu, m2 = 0x03030303u;
    w[0] = (a0 & m4) | ((t & m2) << 4);
    w[1] = (a1 & m4) | (((t >> 2) & m2) << 4);
    w[2] = ((a0 >> 4) & m4) | (((t >> 4) & m2) << 4);
    w[3] = ((a1 >> 4) & m4) | (((t >> 6) & m2) << 4);
}

// those scales less their offset (-32..31)
static inline void fm_q3k_scales(const uint8_t *packed, int8_t out[16]) {
    uint32_t w[4];
    fm_q3k_scale_words(packed, w);
    for (int i = 0; i < 16; i++) out[i] = (int8_t)((w[i / 4] >> (8 * (i % 4))) & 63) - 32;
}

// the 6-bit scale of sub-block ib (32 values) of an IQ4_XS super-block, less its offset of 32
static inline int fm_iq4xs_scale(const block_iq4_xs *x, int ib) {
    return (((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((x->scales_h >> 2 * ib) & 3) << 4)) - 32;
}

// Q2_K, Q3_K's low bits and TQ2_0: value 128h + 32j + l of a block is bits 2j, 2j+1 of byte
// 32h + l of its qs; Q3_K's high bit of it is bit 4h + j of hmask[l]
static inline int fm_q2_bits(const uint8_t *qs, int v) { return (qs[32 * (v / 128) + v % 32] >> (2 * (v / 32 % 4))) & 3; }
static inline int fm_q3_high(const uint8_t *hmask, int v) { return (hmask[v % 32] >> (4 * (v / 128) + v / 32 % 4)) & 1; }

// TQ1_0: five ternary digits per byte, as the byte times 3^k (mod 256) times 3 over 256 gives
// digit k (0..2, the value plus 1). Values 32k + l (k < 5) from qs[l] (l < 32), 160 + 16k + l
// from qs[32 + l] (l < 16), 240 + 4k + l (k < 4) from qh[l] (l < 4)
static inline int fm_trit(uint8_t byte, int k) {
    static const uint8_t pow3[5] = { 1, 3, 9, 27, 81 };
    return ((uint8_t)(byte * pow3[k]) * 3) >> 8;
}
static inline int fm_tq1_digit(const block_tq1_0 *x, int v) {
    if (v < 160) return fm_trit(x->qs[v % 32], v / 32);
    if (v < 240) return fm_trit(x->qs[32 + (v - 160) % 16], (v - 160) / 16);
    return fm_trit(x->qh[(v - 240) % 4], (v - 240) / 4);
}

#endif
