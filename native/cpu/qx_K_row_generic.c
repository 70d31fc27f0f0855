/* Portable C dot products of K-quant super-blocks (Q4_K, Q5_K, Q6_K) with 8-bit activations
 * in blocks of 256 with per-16 sums. The reference for the SIMD siblings; not tuned. */
#include "quants.h"

float fm_dot_q4_K_a8_generic(int n, const void *w, const void *a) {
    const block_q4_K *x = w;
    const block_a8_256 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *q = x[b].qs;
        const int8_t *v = y[b].qs;
        int si = 0;
        for (int j = 0; j < QK_K / 64; j++, q += 32, v += 64) {
            uint8_t sc1, sc2, m;
            fm_scale_min_k4(2 * j, x[b].scales, &sc1, &m);
            fm_scale_min_k4(2 * j + 1, x[b].scales, &sc2, &m);
            int s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += (q[l] & 0xF) * v[l];
                s2 += (q[l] >> 4) * v[l + 32];
            }
            si += sc1 * s1 + sc2 * s2;
        }
        float d = fm_f16_to_f32(x[b].d) * y[b].d;
        float dmin = fm_f16_to_f32(x[b].dmin) * y[b].d;
        sum += d * (float)si - dmin * (float)fm_mins_dot_k4(x[b].scales, y[b].bsums);
    }
    return sum;
}

float fm_dot_q5_K_a8_generic(int n, const void *w, const void *a) {
    const block_q5_K *x = w;
    const block_a8_256 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *q = x[b].qs, *qh = x[b].qh;
        const int8_t *v = y[b].qs;
        int si = 0;
        for (int j = 0; j < QK_K / 64; j++, q += 32, v += 64) {
            uint8_t sc1, sc2, m;
            fm_scale_min_k4(2 * j, x[b].scales, &sc1, &m);
            fm_scale_min_k4(2 * j + 1, x[b].scales, &sc2, &m);
            int s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += ((q[l] & 0xF) | (((qh[l] >> (2 * j)) & 1) << 4)) * v[l];
                s2 += ((q[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4)) * v[l + 32];
            }
            si += sc1 * s1 + sc2 * s2;
        }
        float d = fm_f16_to_f32(x[b].d) * y[b].d;
        float dmin = fm_f16_to_f32(x[b].dmin) * y[b].d;
        sum += d * (float)si - dmin * (float)fm_mins_dot_k4(x[b].scales, y[b].bsums);
    }
    return sum;
}

float fm_dot_q6_K_a8_generic(int n, const void *w, const void *a) {
    const block_q6_K *x = w;
    const block_a8_256 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *sc = x[b].scales, *v = y[b].qs;
        int si = 0;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, v += 128) {
            int s[8] = {0};
            for (int l = 0; l < 32; l++) {
                int g = l / 16;
                s[g + 0] += ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) * v[l];
                s[g + 2] += ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) * v[l + 32];
                s[g + 4] += ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) * v[l + 64];
                s[g + 6] += ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) * v[l + 96];
            }
            for (int g = 0; g < 8; g++) si += sc[g] * (s[g] - 32 * y[b].bsums[8 * h + g]);
        }
        sum += fm_f16_to_f32(x[b].d) * y[b].d * (float)si;
    }
    return sum;
}
