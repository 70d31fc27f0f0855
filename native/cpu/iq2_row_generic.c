/* Portable C dot products of the 2-bit i-quants (IQ2_XXS, IQ2_XS, IQ2_S) with 8-bit activations
 * in blocks of 256, and their row dequantizers (the embedding lookup). The reference for the SIMD
 * siblings; not tuned. Each sub-block of 32 values is read through one decoder per type into
 * its 4 grid entries, 4 sign bytes and 2 scales (one per 16 values), so that the dot and the
 * dequantizer share the bit layout. */
#include <string.h>
#include "internal.h"
#include "../iq_tables.h"

typedef struct {
    uint64_t grid[4];   // 8 unsigned values each, value j in byte j
    uint8_t signs[4];   // bit j set: value j of that entry is negative
    int scale[2];       // 2 * (4-bit scale) + 1 of values 0..15 and 16..31
} iq2_sub;

typedef void (*iq2_sub_fn)(const uint8_t *block, int ib, iq2_sub *s);

static void sub_iq2_xxs(const uint8_t *block, int ib, iq2_sub *s) {
    const block_iq2_xxs *x = (const block_iq2_xxs *)block;
    uint8_t idx[4];
    uint32_t aux;
    memcpy(idx, x->qs + 4 * ib, 4);
    memcpy(&aux, x->qs + 4 * ib + 2, 4);
    for (int l = 0; l < 4; l++) {
        s->grid[l] = fm_iq2xxs_grid[idx[l]];
        s->signs[l] = fm_ksigns_iq2xs[(aux >> 7 * l) & 127];
    }
    s->scale[0] = s->scale[1] = 2 * (int)(aux >> 28) + 1;
}

static void sub_iq2_xs(const uint8_t *block, int ib, iq2_sub *s) {
    const block_iq2_xs *x = (const block_iq2_xs *)block;
    for (int l = 0; l < 4; l++) {
        const uint16_t q = x->qs[4 * ib + l];
        s->grid[l] = fm_iq2xs_grid[q & 511];
        s->signs[l] = fm_ksigns_iq2xs[q >> 9];
    }
    s->scale[0] = 2 * (x->scales[ib] & 15) + 1;
    s->scale[1] = 2 * (x->scales[ib] >> 4) + 1;
}

static void sub_iq2_s(const uint8_t *block, int ib, iq2_sub *s) {
    const block_iq2_s *x = (const block_iq2_s *)block;
    for (int l = 0; l < 4; l++) {
        s->grid[l] = fm_iq2s_grid[x->qs[4 * ib + l] | ((x->qh[ib] >> 2 * l & 3) << 8)];
        s->signs[l] = x->qs[QK_K / 8 + 4 * ib + l];
    }
    s->scale[0] = 2 * (x->scales[ib] & 15) + 1;
    s->scale[1] = 2 * (x->scales[ib] >> 4) + 1;
}

// value j (0..7) of entry l of a decoded sub-block, signed
static inline int sub_value(const iq2_sub *s, int l, int j) {
    const int g = (int)(s->grid[l] >> 8 * j & 0xFF);
    return s->signs[l] >> j & 1 ? -g : g;
}

// sum over the row's blocks of d_w * d_a / 8 * (the integer dot of the block)
static float dot_iq2(int n, const void *w, size_t block_bytes, const void *a, iq2_sub_fn decode) {
    const uint8_t *x = w;
    const block_a8_256 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK_K; b++, x += block_bytes) {
        int si = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            iq2_sub s;
            decode(x, ib, &s);
            const int8_t *v = y[b].qs + 32 * ib;
            int half[2] = { 0, 0 };
            for (int l = 0; l < 4; l++)
                for (int j = 0; j < 8; j++) half[l / 2] += sub_value(&s, l, j) * v[8 * l + j];
            si += s.scale[0] * half[0] + s.scale[1] * half[1];
        }
        fm_f16 d;
        memcpy(&d, x, sizeof d);
        sum += fm_f16_to_f32(d) * y[b].d * 0.125f * (float)si;
    }
    return sum;
}

float fm_dot_iq2_xxs_a8_generic(int n, const void *w, const void *a) {
    return dot_iq2(n, w, sizeof(block_iq2_xxs), a, sub_iq2_xxs);
}

float fm_dot_iq2_xs_a8_generic(int n, const void *w, const void *a) {
    return dot_iq2(n, w, sizeof(block_iq2_xs), a, sub_iq2_xs);
}

float fm_dot_iq2_s_a8_generic(int n, const void *w, const void *a) {
    return dot_iq2(n, w, sizeof(block_iq2_s), a, sub_iq2_s);
}

// y = d * (0.5 + scale) * 0.25 * grid * sign in float, in gguf's order of operations
static void deq_iq2(const void *w, float *y, int n, size_t block_bytes, iq2_sub_fn decode) {
    const uint8_t *x = w;
    for (int b = 0; b < n / QK_K; b++, x += block_bytes) {
        fm_f16 h;
        memcpy(&h, x, sizeof h);
        const float d = fm_half(h);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            iq2_sub s;
            decode(x, ib, &s);
            for (int l = 0; l < 4; l++) {
                const float db = d * (0.5f + (float)((s.scale[l / 2] - 1) / 2)) * 0.25f;
                for (int j = 0; j < 8; j++, y++) {
                    const float v = db * (float)(s.grid[l] >> 8 * j & 0xFF);
                    *y = s.signs[l] >> j & 1 ? -v : v;
                }
            }
        }
    }
}

void fm_deq_iq2_xxs(const void *w, float *y, int n) { deq_iq2(w, y, n, sizeof(block_iq2_xxs), sub_iq2_xxs); }
void fm_deq_iq2_xs(const void *w, float *y, int n) { deq_iq2(w, y, n, sizeof(block_iq2_xs), sub_iq2_xs); }
void fm_deq_iq2_s(const void *w, float *y, int n) { deq_iq2(w, y, n, sizeof(block_iq2_s), sub_iq2_s); }
