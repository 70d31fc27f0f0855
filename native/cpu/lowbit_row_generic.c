/* Portable C dot products of the lower-bit super-blocks (Q2_K, Q3_K, IQ4_XS, TQ2_0, TQ1_0) with
 * 8-bit activations in blocks of 256 with per-16 sums. The reference for the SIMD siblings; not
 * tuned. Q2_K's mins and Q3_K's offset of 4 go through the activation sums of each 16 values. */
#include "lowbit.h"

float fm_dot_q2_K_a8_generic(int n, const void *w, const void *a) {
    const block_q2_K *x = w;
    const block_a8_256 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int si = 0, mins = 0;
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;
            for (int v = 16 * g; v < 16 * g + 16; v++) s += fm_q2_bits(x[b].qs, v) * y[b].qs[v];
            si += (x[b].scales[g] & 0xF) * s;
            mins += (x[b].scales[g] >> 4) * y[b].bsums[g];
        }
        sum += fm_f16_to_f32(x[b].d) * y[b].d * (float)si - fm_f16_to_f32(x[b].dmin) * y[b].d * (float)mins;
    }
    return sum;
}

float fm_dot_q3_K_a8_generic(int n, const void *w, const void *a) {
    const block_q3_K *x = w;
    const block_a8_256 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int8_t sc[16];
        fm_q3k_scales(x[b].scales, sc);
        int si = 0;
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;   // quants stored as 0..7, the value plus 4
            for (int v = 16 * g; v < 16 * g + 16; v++)
                s += (fm_q2_bits(x[b].qs, v) | fm_q3_high(x[b].hmask, v) << 2) * y[b].qs[v];
            si += sc[g] * (s - 4 * y[b].bsums[g]);
        }
        sum += fm_f16_to_f32(x[b].d) * y[b].d * (float)si;
    }
    return sum;
}

float fm_dot_iq4_xs_a8_generic(int n, const void *w, const void *a) {
    const block_iq4_xs *x = w;
    const block_a8_256 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int si = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint8_t *q = x[b].qs + 16 * ib;
            const int8_t *v = y[b].qs + 32 * ib;
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += fm_kvalues_iq4nl[q[l] & 0xF] * v[l] + fm_kvalues_iq4nl[q[l] >> 4] * v[l + 16];
            si += fm_iq4xs_scale(&x[b], ib) * s;
        }
        sum += fm_f16_to_f32(x[b].d) * y[b].d * (float)si;
    }
    return sum;
}

// the ternary types: digits 0..2 (the value plus 1), less the sum of the block's activations
static int a8_block_sum(const block_a8_256 *y) {
    int s = 0;
    for (int j = 0; j < QK_K / 32; j++) s += y->sums32[j];
    return s;
}

float fm_dot_tq2_0_a8_generic(int n, const void *w, const void *a) {
    const block_tq2_0 *x = w;
    const block_a8_256 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int s = 0;
        for (int v = 0; v < QK_K; v++) s += fm_q2_bits(x[b].qs, v) * y[b].qs[v];
        sum += fm_f16_to_f32(x[b].d) * y[b].d * (float)(s - a8_block_sum(&y[b]));
    }
    return sum;
}

float fm_dot_tq1_0_a8_generic(int n, const void *w, const void *a) {
    const block_tq1_0 *x = w;
    const block_a8_256 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int s = 0;
        for (int v = 0; v < QK_K; v++) s += fm_tq1_digit(&x[b], v) * y[b].qs[v];
        sum += fm_f16_to_f32(x[b].d) * y[b].d * (float)(s - a8_block_sum(&y[b]));
    }
    return sum;
}
