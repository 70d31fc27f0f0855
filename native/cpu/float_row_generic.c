/* Portable C dot products of float weight rows (F32, F16, BF16) with float activations, for
 * the small tensors (router, gates) that files keep unquantized. Also the f16 conversions. */
#include <string.h>
#include "quants.h"

float fm_f16_to_f32(fm_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal: renormalise
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float fm_f16_table[1 << 16];

__attribute__((constructor)) static void fill_f16_table(void) {
    for (uint32_t h = 0; h < 1u << 16; h++) fm_f16_table[h] = fm_f16_to_f32((fm_f16)h);
}

fm_f16 fm_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xFF) - 127 + 15;
    uint32_t man = x & 0x7FFFFF;
    if (((x >> 23) & 0xFF) == 0xFF) return (fm_f16)(sign | 0x7C00 | (man ? 0x200 : 0));
    if (exp >= 31) return (fm_f16)(sign | 0x7C00);
    if (exp <= 0) {
        if (exp < -10) return (fm_f16)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (fm_f16)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;  // round to nearest even
    return (fm_f16)h;
}

float fm_dot_f32_generic(int n, const void *w, const void *a) {
    const float *x = w, *y = a;
    float s[4] = {0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) s[k] += x[i + k] * y[i + k];
    for (; i < n; i++) s[0] += x[i] * y[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

float fm_dot_f16_generic(int n, const void *w, const void *a) {
    const fm_f16 *x = w;
    const float *y = a;
    float s[4] = {0};
    int i = 0;
    for (; i + 4 <= n; i += 4)   // fm_half: branch-light, and exact for the finite values weights hold
        for (int k = 0; k < 4; k++) s[k] += fm_half(x[i + k]) * y[i + k];
    for (; i < n; i++) s[0] += fm_half(x[i]) * y[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

float fm_dot_bf16_generic(int n, const void *w, const void *a) {
    const uint16_t *x = w;
    const float *y = a;
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)x[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        s += f * y[i];
    }
    return s;
}
