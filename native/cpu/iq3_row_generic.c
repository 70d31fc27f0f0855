/* IQ3_XXS and IQ3_S in plain C: the row dequantizers (the embedding lookup; gguf's float
 * operations in its order) and the dot products with 8-bit activations, whose integer sums and
 * float steps every SIMD sibling repeats exactly (iq_lowbit.h). */
#include "internal.h"
#include "iq_lowbit.h"

uint8_t fm_iq3s_codes[2][512] __attribute__((aligned(64)));
uint8_t fm_iq3xxs_codes[2][256] __attribute__((aligned(64)));

static int level_code(uint8_t value, const uint8_t levels[8]) {
    int c = 0;
    while (levels[c] != value) c++;
    return c;
}

static void fill_codes(const uint32_t *grid, int entries, const uint8_t levels[8], uint8_t *lo, uint8_t *hi) {
    for (int i = 0; i < entries; i++) {
        const uint8_t *g = (const uint8_t *)&grid[i];
        lo[i] = (uint8_t)(level_code(g[0], levels) | level_code(g[1], levels) << 4);
        hi[i] = (uint8_t)(level_code(g[2], levels) | level_code(g[3], levels) << 4);
    }
}

__attribute__((constructor)) static void fill_iq3_codes(void) {
    static const uint8_t odd[8] = { 1, 3, 5, 7, 9, 11, 13, 15 }, xxs[8] = FM_IQ3XXS_LEVELS;
    fill_codes(fm_iq3s_grid, 512, odd, fm_iq3s_codes[0], fm_iq3s_codes[1]);
    fill_codes(fm_iq3xxs_grid, 256, xxs, fm_iq3xxs_codes[0], fm_iq3xxs_codes[1]);
}

// sum over 8 grid entries (of 4 values each) of grid * sign * activation, signs bit v of `signs`
static int32_t grid_dot(const uint32_t *const entries[8], uint32_t signs, const int8_t *a) {
    int32_t t = 0;
    for (int k = 0; k < 8; k++) {
        const uint8_t *g = (const uint8_t *)entries[k];
        for (int i = 0; i < 4; i++) {
            const int v = 4 * k + i, p = g[i] * a[v];
            t += (signs >> v) & 1 ? -p : p;
        }
    }
    return t;
}

float fm_dot_iq3_xxs_a8_generic(int n, const void *w, const void *a) {
    const block_iq3_xxs *x = w;
    const block_a8_256 *y = a;
    float s = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int32_t isum = 0;
        for (int j = 0; j < 8; j++) {
            const uint32_t aux = fm_iq3xxs_aux(x + b, j);
            const uint32_t *entries[8];
            for (int k = 0; k < 8; k++) entries[k] = &fm_iq3xxs_grid[x[b].qs[8 * j + k]];
            isum += (int32_t)(2 * (aux >> 28) + 1) * grid_dot(entries, fm_iq3xxs_signs(aux), y[b].qs + 32 * j);
        }
        s += fm_iq_block_scale(fm_half(x[b].d), y[b].d, FM_IQ3XXS_POW2) * (float)isum;
    }
    return s;
}

float fm_dot_iq3_s_a8_generic(int n, const void *w, const void *a) {
    const block_iq3_s *x = w;
    const block_a8_256 *y = a;
    float s = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int32_t isum = 0;
        for (int j = 0; j < 8; j++) {
            const uint32_t *entries[8];
            for (int k = 0; k < 8; k++) entries[k] = &fm_iq3s_grid[fm_iq3s_index(x + b, j, k)];
            isum += fm_iq3s_ls(x + b, j) * grid_dot(entries, fm_iq3s_signs(x + b, j), y[b].qs + 32 * j);
        }
        s += fm_iq_block_scale(fm_half(x[b].d), y[b].d, FM_IQ3S_POW2) * (float)isum;
    }
    return s;
}

// y = db * grid * sign, db = d * (0.5 + s) * 0.5, as gguf computes it in float32
void fm_deq_iq3_xxs(const void *w, float *y, int n) {
    const block_iq3_xxs *x = w;
    for (int b = 0; b < n / QK_K; b++) {
        const float d = fm_half(x[b].d);
        for (int j = 0; j < 8; j++, y += 32) {
            const uint32_t aux = fm_iq3xxs_aux(x + b, j), signs = fm_iq3xxs_signs(aux);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            for (int v = 0; v < 32; v++) {
                const uint8_t *g = (const uint8_t *)&fm_iq3xxs_grid[x[b].qs[8 * j + v / 4]];
                y[v] = db * (float)g[v % 4] * ((signs >> v) & 1 ? -1.0f : 1.0f);
            }
        }
    }
}

// y = db * grid * sign, db = d * (1 + 2 s)
void fm_deq_iq3_s(const void *w, float *y, int n) {
    const block_iq3_s *x = w;
    for (int b = 0; b < n / QK_K; b++) {
        const float d = fm_half(x[b].d);
        for (int j = 0; j < 8; j++, y += 32) {
            const uint32_t signs = fm_iq3s_signs(x + b, j);
            const float db = d * (float)fm_iq3s_ls(x + b, j);
            for (int v = 0; v < 32; v++) {
                const uint8_t *g = (const uint8_t *)&fm_iq3s_grid[fm_iq3s_index(x + b, j, v / 4)];
                y[v] = db * (float)g[v % 4] * ((signs >> v) & 1 ? -1.0f : 1.0f);
            }
        }
    }
}
