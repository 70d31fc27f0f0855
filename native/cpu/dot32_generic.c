/* Portable C dot products of 32-value blocks (Q4_0, Q8_0) with 8-bit activations.
 * The reference every SIMD sibling is tested against; not tuned for speed. */
#include "quants.h"

float fm_dot_q4_0_a8_generic(int n, const void *w, const void *a) {
    const block_q4_0 *x = w;
    const block_a8_32 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK32; b++) {
        int s = 0;
        for (int j = 0; j < QK32 / 2; j++) {
            s += ((x[b].qs[j] & 0xF) - 8) * y[b].qs[j];
            s += ((x[b].qs[j] >> 4) - 8) * y[b].qs[j + QK32 / 2];
        }
        sum += fm_f16_to_f32(x[b].d) * y[b].d * (float)s;
    }
    return sum;
}

float fm_dot_q8_0_a8_generic(int n, const void *w, const void *a) {
    const block_q8_0 *x = w;
    const block_a8_32 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK32; b++) {
        int s = 0;
        for (int j = 0; j < QK32; j++) s += x[b].qs[j] * y[b].qs[j];
        sum += fm_f16_to_f32(x[b].d) * y[b].d * (float)s;
    }
    return sum;
}
