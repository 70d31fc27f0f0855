/* Portable C dot products of 32-value blocks (Q4_0, Q8_0) with 8-bit activations.
 * The reference every SIMD sibling is tested against; not tuned for speed. */
#include "quants.h"

float fm_dot_q4_0_a8_generic(int n, const void *w, const void *a) {
    const block_q4_0 *x = w;
    const int nb = n / QK32;
    const int8_t *q = a;
    const float *dy = fm_a32_d(a, nb);
    float sum = 0.0f;
    for (int b = 0; b < nb; b++, q += QK32) {
        int s = 0;
        for (int j = 0; j < QK32 / 2; j++) {
            s += ((x[b].qs[j] & 0xF) - 8) * q[j];
            s += ((x[b].qs[j] >> 4) - 8) * q[j + QK32 / 2];
        }
        sum += fm_f16_to_f32(x[b].d) * dy[b] * (float)s;
    }
    return sum;
}

float fm_dot_q8_0_a8_generic(int n, const void *w, const void *a) {
    const block_q8_0 *x = w;
    const int nb = n / QK32;
    const int8_t *q = a;
    const float *dy = fm_a32_d(a, nb);
    float sum = 0.0f;
    for (int b = 0; b < nb; b++, q += QK32) {
        int s = 0;
        for (int j = 0; j < QK32; j++) s += x[b].qs[j] * q[j];
        sum += fm_f16_to_f32(x[b].d) * dy[b] * (float)s;
    }
    return sum;
}
