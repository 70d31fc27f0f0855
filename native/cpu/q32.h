/* The 32 codes of a block of the other 32-value types (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4), in
 * portable C: for the generic dots and the row dequantizers, which the SIMD kernels are tested
 * against. Value j of a block is scale * code[j] (+ the block's min for Q4_1 and Q5_1). */
#ifndef FERMIUM_Q32_H
#define FERMIUM_Q32_H
#include <string.h>
#include "quants.h"
#include "../iq_tables.h"

// the 4-bit codes: low nibbles are values 0..15, high nibbles 16..31
static inline void fm_q32_nibbles(const uint8_t *qs, int code[QK32]) {
    for (int j = 0; j < QK32 / 2; j++) {
        code[j] = qs[j] & 0xF;
        code[j + QK32 / 2] = qs[j] >> 4;
    }
}

// the 5-bit codes: bit j of qh (a little-endian word) is bit 4 of value j
static inline void fm_q32_fives(const uint8_t *qh, const uint8_t *qs, int code[QK32]) {
    uint32_t h;
    memcpy(&h, qh, 4);
    fm_q32_nibbles(qs, code);
    for (int j = 0; j < QK32; j++) code[j] |= (int)((h >> j) & 1) << 4;
}

// the code-book values of the 4-bit codes
static inline void fm_q32_book(const uint8_t *qs, const int8_t book[16], int code[QK32]) {
    fm_q32_nibbles(qs, code);
    for (int j = 0; j < QK32; j++) code[j] = book[code[j]];
}

// every type's block as (scale, min, codes): value j = d * code[j] + m
static inline void fm_q4_1_codes(const block_q4_1 *x, float *d, float *m, int code[QK32]) {
    *d = fm_f16_to_f32(x->d), *m = fm_f16_to_f32(x->m);
    fm_q32_nibbles(x->qs, code);
}
static inline void fm_q5_0_codes(const block_q5_0 *x, float *d, float *m, int code[QK32]) {
    *d = fm_f16_to_f32(x->d), *m = 0.0f;
    fm_q32_fives(x->qh, x->qs, code);
    for (int j = 0; j < QK32; j++) code[j] -= 16;
}
static inline void fm_q5_1_codes(const block_q5_1 *x, float *d, float *m, int code[QK32]) {
    *d = fm_f16_to_f32(x->d), *m = fm_f16_to_f32(x->m);
    fm_q32_fives(x->qh, x->qs, code);
}
static inline void fm_iq4_nl_codes(const block_iq4_nl *x, float *d, float *m, int code[QK32]) {
    *d = fm_f16_to_f32(x->d), *m = 0.0f;
    fm_q32_book(x->qs, fm_kvalues_iq4nl, code);
}
static inline void fm_mxfp4_codes(const block_mxfp4 *x, float *d, float *m, int code[QK32]) {
    *d = fm_e8m0_half(x->e), *m = 0.0f;
    fm_q32_book(x->qs, fm_kvalues_mxfp4, code);
}

#endif
