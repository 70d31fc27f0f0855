/* IQ1_S and IQ1_M in plain C: the row dequantizers (the embedding lookup; gguf's float
 * operations in its order), the dot products with 8-bit activations, whose integer sums and
 * float steps every SIMD sibling repeats exactly (iq_lowbit.h), and the SIMD kernels' table. */
#include "internal.h"
#include "iq_lowbit.h"

uint64_t fm_iq1_grid8[4096];

__attribute__((constructor)) static void fill_iq1_grid8(void) {
    for (int i = 0; i < 4096; i++) {
        const int8_t *g = (const int8_t *)&fm_iq1s_grid[i & 2047];
        const int delta = i >> 11 ? -1 : 1;
        uint64_t e = 0;
        for (int k = 0; k < 8; k++) e |= (uint64_t)(8 * g[k] + delta + FM_IQ1_GRID8_OFFSET) << 8 * k;
        fm_iq1_grid8[i] = e;
    }
}

// sum over the 8 values of entry `index` (12 bits, iq_lowbit.h) of (8 grid + delta) * a
static int32_t entry_dot(int index, const int8_t *a) {
    const int8_t *g = (const int8_t *)&fm_iq1s_grid[index & 2047];
    const int delta = index >> 11 ? -1 : 1;
    int32_t t = 0;
    for (int k = 0; k < 8; k++) t += (8 * g[k] + delta) * a[k];
    return t;
}

float fm_dot_iq1_s_a8_generic(int n, const void *w, const void *a) {
    const block_iq1_s *x = w;
    const block_a8_256 *y = a;
    float s = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int32_t isum = 0;
        for (int j = 0; j < 8; j++) {
            int32_t t = 0;
            for (int l = 0; l < 4; l++) t += entry_dot(fm_iq1s_index(x + b, j, l), y[b].qs + 32 * j + 8 * l);
            isum += fm_iq1s_ls(x + b, j) * t;
        }
        s += fm_iq_block_scale(fm_half(x[b].d), y[b].d, FM_IQ1_POW2) * (float)isum;
    }
    return s;
}

float fm_dot_iq1_m_a8_generic(int n, const void *w, const void *a) {
    const block_iq1_m *x = w;
    const block_a8_256 *y = a;
    float s = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int32_t isum = 0;
        for (int t = 0; t < 16; t++)   // 16 values, two entries, per scale
            isum += fm_iq1m_ls(x + b, t) * (entry_dot(fm_iq1m_index(x + b, 2 * t), y[b].qs + 16 * t)
                                            + entry_dot(fm_iq1m_index(x + b, 2 * t + 1), y[b].qs + 16 * t + 8));
        s += fm_iq_block_scale(fm_half(fm_iq1m_d(x + b)), y[b].d, FM_IQ1_POW2) * (float)isum;
    }
    return s;
}

// y = dl * (grid + delta), dl = d * (2 s + 1), as gguf computes it in float32
static void deq_entry(int index, float dl, float *y) {
    const int8_t *g = (const int8_t *)&fm_iq1s_grid[index & 2047];
    const float delta = index >> 11 ? -FM_IQ1S_DELTA : FM_IQ1S_DELTA;
    for (int k = 0; k < 8; k++) y[k] = dl * ((float)g[k] + delta);
}

void fm_deq_iq1_s(const void *w, float *y, int n) {
    const block_iq1_s *x = w;
    for (int b = 0; b < n / QK_K; b++) {
        const float d = fm_half(x[b].d);
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 4; l++, y += 8) deq_entry(fm_iq1s_index(x + b, j, l), d * (float)fm_iq1s_ls(x + b, j), y);
    }
}

void fm_deq_iq1_m(const void *w, float *y, int n) {
    const block_iq1_m *x = w;
    for (int b = 0; b < n / QK_K; b++) {
        const float d = fm_half(fm_iq1m_d(x + b));
        for (int e = 0; e < 32; e++, y += 8) deq_entry(fm_iq1m_index(x + b, e), d * (float)fm_iq1m_ls(x + b, e / 2), y);
    }
}
