/* Activation quantizers (fp32 -> 8-bit blocks for the integer dots) and weight row
 * dequantizers (for the embedding lookup). Portable C: these touch kilobytes, not the weights. */
#include <math.h>
#include <string.h>
#include "internal.h"
#include "q32.h"
#include "lowbit.h"

// lrintf as one cvtss2si (it sets no errno), and a max that the compiler can keep inline
#pragma GCC optimize("no-math-errno")
static inline float absmax(const float *x, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        m = a > m ? a : m;
    }
    return m;
}

static void quantize_a8_32(const float *x, int n, void *act) {
    const int nb = n / QK32;
    int8_t *qs = act;
    float *ds = (float *)fm_a32_d(act, nb), *ss = (float *)fm_a32_s(act, nb);
    for (int b = 0; b < nb; b++, x += QK32, qs += QK32) {
        const float amax = absmax(x, QK32);
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int i = 0; i < QK32; i++) {
            qs[i] = (int8_t)lrintf(x[i] * id);
            sum += qs[i];
        }
        ds[b] = d;
        ss[b] = d * (float)sum;
    }
}

static void quantize_a8_256(const float *x, int n, block_a8_256 *y) {
    for (int b = 0; b < n / QK_K; b++, x += QK_K) {
        const float amax = absmax(x, QK_K);
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        y[b].d = d;
        for (int i = 0; i < QK_K; i++) y[b].qs[i] = (int8_t)lrintf(x[i] * id);
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += y[b].qs[16 * g + i];
            y[b].bsums[g] = (int16_t)s;
        }
        for (int j = 0; j < QK_K / 32; j++) y[b].sums32[j] = (int16_t)(y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
    }
}

// the quants of each group of `size` values reordered for a repacked layout (quants.h): position
// p of a group takes the value value_at(p) of the group in natural order
static void reorder_quants(int8_t *qs, int n, int size, size_t stride, int (*value_at)(int)) {
    for (int g = 0; g < n / size; g++, qs += stride) {
        int8_t natural[QK_K];
        memcpy(natural, qs, (size_t)size);
        for (int p = 0; p < size; p++) qs[p] = natural[value_at(p)];
    }
}

// the offset corrections of one 16-byte lane (quants.h): for each of its 8 int16 lanes, -offset
// times the sum of the activations under it in `regs` registers, `stride` bytes apart
static void lane_offsets(const int8_t *qs, int regs, size_t stride, int offset, int16_t *corr) {
    for (int l = 0; l < 8; l++) {
        int s = 0;
        for (int r = 0; r < regs; r++) s += qs[stride * r + 2 * l] + qs[stride * r + 2 * l + 1];
        corr[l] = (int16_t)(-offset * s);
    }
}

// those that follow the blocks of an ACT_A8_256P row: per block, its 4 lanes of the 4 registers
// R0..R3 (64 bytes apart), for the +32 of Q6_Kp's quants
static void q6kp_offsets(const block_a8_256 *y, int nb) {
    int16_t *corr = (int16_t *)fm_q6kp_offsets(y, nb);
    for (int b = 0; b < nb; b++)
        for (int q = 0; q < 4; q++, corr += 8) lane_offsets(y[b].qs + 16 * q, 4, 64, 32, corr);
}

// those that follow an ACT_A8_32P row: per group of 128 values, its 8 registers (16 bytes
// apart), for the 8 of Q4_0p's nibbles
static void q4_0p_offsets(const int8_t *qs, int n) {
    int16_t *corr = (int16_t *)fm_q4_0p_offsets(qs, n / QK32);
    for (int g = 0; g < n / QK_Q4_0P; g++, qs += QK_Q4_0P, corr += 8) lane_offsets(qs, 8, 16, 8, corr);
}

size_t fm_act_bytes(int type, int n) {
    switch (FM_TYPES[fm_kind_of(type)].act) {
    case ACT_A8_32: return FM_A32_BYTES(n / QK32);
    case ACT_A8_32P: return FM_A32_BYTES(n / QK32) + (size_t)(n / QK_Q4_0P) * 8 * sizeof(int16_t);
    case ACT_A8_256:
    case ACT_A8_256K: return (size_t)(n / QK_K) * sizeof(block_a8_256);
    case ACT_A8_256P: return (size_t)(n / QK_K) * (sizeof(block_a8_256) + 4 * 8 * sizeof(int16_t));
    default: return (size_t)n * sizeof(float);
    }
}

void fm_quantize_act(int type, const float *x, int n, void *act) {
    block_a8_256 *blocks = act;
    switch (FM_TYPES[fm_kind_of(type)].act) {
    case ACT_A8_32: quantize_a8_32(x, n, act); break;
    case ACT_A8_32P:   // block scales and sums as ACT_A8_32, the quants in Q4_0p order, then the offsets
        quantize_a8_32(x, n, act);
        reorder_quants(act, n, QK_Q4_0P, QK_Q4_0P, fm_q4_0p_value);
        q4_0p_offsets(act, n);
        break;
    case ACT_A8_256: quantize_a8_256(x, n, act); break;
    case ACT_A8_256P:  // sums of each 16 values in natural order, the quants in Q6_Kp order
        quantize_a8_256(x, n, blocks);
        reorder_quants(blocks->qs, n, QK_K, sizeof *blocks, fm_q6kp_value);
        q6kp_offsets(blocks, n / QK_K);
        break;
    case ACT_A8_256K:  // the same, the quants in Q4_Kp order
        quantize_a8_256(x, n, blocks);
        reorder_quants(blocks->qs, n, QK_K, sizeof *blocks, fm_q4kp_value);
        break;
    default: memcpy(act, x, (size_t)n * sizeof(float));
    }
}

// ---- dequantization of one row (n values)

static void deq_q4_0(const void *w, float *y, int n) {
    const block_q4_0 *x = w;
    for (int b = 0; b < n / QK32; b++, y += QK32) {
        const float d = fm_half(x[b].d);
        for (int j = 0; j < QK32 / 2; j++) {
            y[j] = d * ((x[b].qs[j] & 0xF) - 8);
            y[j + QK32 / 2] = d * ((x[b].qs[j] >> 4) - 8);
        }
    }
}

static void deq_q8_0(const void *w, float *y, int n) {
    const block_q8_0 *x = w;
    for (int b = 0; b < n / QK32; b++, y += QK32)
        for (int j = 0; j < QK32; j++) y[j] = fm_half(x[b].d) * x[b].qs[j];
}

static void deq_q4_K(const void *w, float *y, int n) {
    const block_q4_K *x = w;
    for (int b = 0; b < n / QK_K; b++) {
        const float d = fm_half(x[b].d), dmin = fm_half(x[b].dmin);
        const uint8_t *q = x[b].qs;
        for (int j = 0; j < 4; j++, q += 32, y += 64) {
            uint8_t s1, m1, s2, m2;
            fm_scale_min_k4(2 * j, x[b].scales, &s1, &m1);
            fm_scale_min_k4(2 * j + 1, x[b].scales, &s2, &m2);
            for (int l = 0; l < 32; l++) {
                y[l] = d * s1 * (q[l] & 0xF) - dmin * m1;
                y[l + 32] = d * s2 * (q[l] >> 4) - dmin * m2;
            }
        }
    }
}

static void deq_q5_K(const void *w, float *y, int n) {
    const block_q5_K *x = w;
    for (int b = 0; b < n / QK_K; b++) {
        const float d = fm_half(x[b].d), dmin = fm_half(x[b].dmin);
        const uint8_t *q = x[b].qs, *qh = x[b].qh;
        for (int j = 0; j < 4; j++, q += 32, y += 64) {
            uint8_t s1, m1, s2, m2;
            fm_scale_min_k4(2 * j, x[b].scales, &s1, &m1);
            fm_scale_min_k4(2 * j + 1, x[b].scales, &s2, &m2);
            for (int l = 0; l < 32; l++) {
                y[l] = d * s1 * ((q[l] & 0xF) | (((qh[l] >> (2 * j)) & 1) << 4)) - dmin * m1;
                y[l + 32] = d * s2 * ((q[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4)) - dmin * m2;
            }
        }
    }
}

static void deq_q6_K(const void *w, float *y, int n) {
    const block_q6_K *x = w;
    for (int b = 0; b < n / QK_K; b++) {
        const float d = fm_half(x[b].d);
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *sc = x[b].scales;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                const int g = l / 16;
                y[l] = d * sc[g] * (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                y[l + 32] = d * sc[g + 2] * (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                y[l + 64] = d * sc[g + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                y[l + 96] = d * sc[g + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
    }
}

static void deq_q2_K(const void *w, float *y, int n) {
    const block_q2_K *x = w;
    for (int b = 0; b < n / QK_K; b++, y += QK_K) {
        const float d = fm_half(x[b].d), dmin = fm_half(x[b].dmin);
        for (int v = 0; v < QK_K; v++)
            y[v] = d * (x[b].scales[v / 16] & 0xF) * fm_q2_bits(x[b].qs, v) - dmin * (x[b].scales[v / 16] >> 4);
    }
}

static void deq_q3_K(const void *w, float *y, int n) {
    const block_q3_K *x = w;
    for (int b = 0; b < n / QK_K; b++, y += QK_K) {
        int8_t sc[16];
        fm_q3k_scales(x[b].scales, sc);
        const float d = fm_half(x[b].d);
        for (int v = 0; v < QK_K; v++)
            y[v] = d * sc[v / 16] * (fm_q2_bits(x[b].qs, v) - (fm_q3_high(x[b].hmask, v) ? 0 : 4));
    }
}

static void deq_iq4_xs(const void *w, float *y, int n) {
    const block_iq4_xs *x = w;
    for (int b = 0; b < n / QK_K; b++)
        for (int ib = 0; ib < QK_K / 32; ib++, y += 32) {
            const float dl = fm_half(x[b].d) * fm_iq4xs_scale(&x[b], ib);
            for (int l = 0; l < 16; l++) {
                y[l] = dl * fm_kvalues_iq4nl[x[b].qs[16 * ib + l] & 0xF];
                y[l + 16] = dl * fm_kvalues_iq4nl[x[b].qs[16 * ib + l] >> 4];
            }
        }
}

static void deq_tq2_0(const void *w, float *y, int n) {
    const block_tq2_0 *x = w;
    for (int b = 0; b < n / QK_K; b++, y += QK_K)
        for (int v = 0; v < QK_K; v++) y[v] = fm_half(x[b].d) * (fm_q2_bits(x[b].qs, v) - 1);
}

static void deq_tq1_0(const void *w, float *y, int n) {
    const block_tq1_0 *x = w;
    for (int b = 0; b < n / QK_K; b++, y += QK_K)
        for (int v = 0; v < QK_K; v++) y[v] = fm_half(x[b].d) * (fm_tq1_digit(&x[b], v) - 1);
}

static void deq_f32(const void *w, float *y, int n) { memcpy(y, w, (size_t)n * sizeof(float)); }

static void deq_f16(const void *w, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] = fm_f16_to_f32(((const fm_f16 *)w)[i]);
}

static void deq_bf16(const void *w, float *y, int n) {
    for (int i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)((const uint16_t *)w)[i] << 16;
        memcpy(y + i, &bits, 4);
    }
}

// Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4: d * code + m per value (q32.h), as GGML computes it
#define DEQ_Q32(name, block_t, codes)                                       \
    static void name(const void *w, float *y, int n) {                      \
        const block_t *x = w;                                               \
        for (int b = 0; b < n / QK32; b++, y += QK32) {                     \
            int code[QK32];                                                 \
            float d, m;                                                     \
            codes(x + b, &d, &m, code);                                     \
            for (int j = 0; j < QK32; j++) y[j] = d * (float)code[j] + m;   \
        }                                                                   \
    }
DEQ_Q32(deq_q4_1, block_q4_1, fm_q4_1_codes)
DEQ_Q32(deq_q5_0, block_q5_0, fm_q5_0_codes)
DEQ_Q32(deq_q5_1, block_q5_1, fm_q5_1_codes)
DEQ_Q32(deq_iq4_nl, block_iq4_nl, fm_iq4_nl_codes)
DEQ_Q32(deq_mxfp4, block_mxfp4, fm_mxfp4_codes)

typedef void (*deq_fn)(const void *w, float *y, int n);
static const deq_fn DEQUANT[KIND_COUNT] = {
    [KIND_Q4_0] = deq_q4_0, [KIND_Q8_0] = deq_q8_0, [KIND_Q4_K] = deq_q4_K, [KIND_Q5_K] = deq_q5_K,
    [KIND_Q6_K] = deq_q6_K, [KIND_F32] = deq_f32, [KIND_F16] = deq_f16, [KIND_BF16] = deq_bf16,
    [KIND_IQ2_XXS] = fm_deq_iq2_xxs, [KIND_IQ2_XS] = fm_deq_iq2_xs, [KIND_IQ2_S] = fm_deq_iq2_s,
    [KIND_Q4_1] = deq_q4_1, [KIND_Q5_0] = deq_q5_0, [KIND_Q5_1] = deq_q5_1, [KIND_IQ4_NL] = deq_iq4_nl,
    [KIND_MXFP4] = deq_mxfp4,
    [KIND_Q2_K] = deq_q2_K, [KIND_Q3_K] = deq_q3_K, [KIND_IQ4_XS] = deq_iq4_xs, [KIND_TQ2_0] = deq_tq2_0,
    [KIND_TQ1_0] = deq_tq1_0,
    [KIND_IQ3_XXS] = fm_deq_iq3_xxs, [KIND_IQ3_S] = fm_deq_iq3_s, [KIND_IQ1_S] = fm_deq_iq1_s, [KIND_IQ1_M] = fm_deq_iq1_m,
};

void fm_dequant_row(int type, const void *w, float *out, int n) { DEQUANT[fm_kind_of(type)](w, out, n); }
