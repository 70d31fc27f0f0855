// quant.cuh: decode 8 consecutive weights of one GGUF row into fp32.
// `row` points at the row's first block, `k` is the element index (a multiple of 8), `v` gets
// the values. The layouts are GGML's block formats; one function per type, one signature.
// Host-callable as well, so tools can check them against gguf's numpy dequantizer.
#pragma once
#include "fermi.cuh"

// ---------------------------------------------------------------------------- plain floats
FM_HD void dq8_f32(const unsigned char* row, int k, float* v) {
    const float* p = (const float*)row + k;
    for (int i = 0; i < 8; ++i) v[i] = p[i];
}

FM_HD void dq8_f16(const unsigned char* row, int k, float* v) {
    const unsigned short* p = (const unsigned short*)row + k;
    for (int i = 0; i < 8; ++i) v[i] = fm_half_to_float(p[i]);
}

FM_HD void dq8_bf16(const unsigned char* row, int k, float* v) {
    const unsigned short* p = (const unsigned short*)row + k;
    for (int i = 0; i < 8; ++i) v[i] = fm_bf16_to_float(p[i]);
}

// ---------------------------------------------------------------------------- 32-element blocks
// Q8_0: {f16 d; int8 q[32]}, 34 bytes
FM_HD void dq8_q8_0(const unsigned char* row, int k, float* v) {
    const unsigned char* b = row + (k >> 5) * 34;
    float d = fm_half_to_float(fm_u16(b));
    const signed char* q = (const signed char*)(b + 2) + (k & 31);
    for (int i = 0; i < 8; ++i) v[i] = d * (float)q[i];
}

// Q4_0: {f16 d; u8 qs[16]}, 18 bytes; element j < 16 is the low nibble of qs[j], j >= 16 the high one of qs[j-16]
FM_HD void dq8_q4_0(const unsigned char* row, int k, float* v) {
    const unsigned char* b = row + (k >> 5) * 18;
    float d = fm_half_to_float(fm_u16(b));
    int j = k & 31;
    const unsigned char* qs = b + 2 + (j & 15);
    int shift = (j >> 4) * 4;
    for (int i = 0; i < 8; ++i) v[i] = d * (float)((int)((qs[i] >> shift) & 15) - 8);
}

// ---------------------------------------------------------------------------- 256-element super-blocks
// 6-bit scale and min of sub-block j from the 12 packed bytes shared by Q4_K and Q5_K
FM_HD void k4_scale_min(const unsigned char* s, int j, float* sc, float* mn) {
    if (j < 4) {
        *sc = (float)(s[j] & 63);
        *mn = (float)(s[j + 4] & 63);
    } else {
        *sc = (float)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *mn = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// Q4_K: {f16 d, dmin; u8 scales[12]; u8 qs[128]}, 144 bytes; sub-block j of 32 reads
// qs[32*(j/2) + l] low nibble (j even) or high nibble (j odd)
FM_HD void dq8_q4_k(const unsigned char* row, int k, float* v) {
    const unsigned char* b = row + (k >> 8) * 144;
    int e = k & 255, j = e >> 5, l = e & 31;
    float sc, mn;
    k4_scale_min(b + 4, j, &sc, &mn);
    float d = fm_half_to_float(fm_u16(b)) * sc;
    float m = fm_half_to_float(fm_u16(b + 2)) * mn;
    const unsigned char* qs = b + 16 + 32 * (j >> 1) + l;
    int shift = (j & 1) * 4;
    for (int i = 0; i < 8; ++i) v[i] = d * (float)((qs[i] >> shift) & 15) - m;
}

// Q5_K: {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}, 176 bytes; the fifth bit of
// element l of sub-block j is bit j of qh[l]
FM_HD void dq8_q5_k(const unsigned char* row, int k, float* v) {
    const unsigned char* b = row + (k >> 8) * 176;
    int e = k & 255, j = e >> 5, l = e & 31;
    float sc, mn;
    k4_scale_min(b + 4, j, &sc, &mn);
    float d = fm_half_to_float(fm_u16(b)) * sc;
    float m = fm_half_to_float(fm_u16(b + 2)) * mn;
    const unsigned char* qh = b + 16 + l;
    const unsigned char* qs = b + 48 + 32 * (j >> 1) + l;
    int shift = (j & 1) * 4;
    for (int i = 0; i < 8; ++i) {
        int q = ((qs[i] >> shift) & 15) | (((qh[i] >> j) & 1) << 4);
        v[i] = d * (float)q - m;
    }
}

// Q6_K: {u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d}, 210 bytes. In half n (128 elements)
// element r takes ql[64n + r%64] >> 4*(r/64) and qh[32n + r%32] >> 2*(r/32); scale per 16.
FM_HD void dq8_q6_k(const unsigned char* row, int k, float* v) {
    const unsigned char* b = row + (k >> 8) * 210;
    int e = k & 255, n = e >> 7, r = e & 127;
    float d = fm_half_to_float(fm_u16(b + 208)) * (float)((const signed char*)(b + 192))[e >> 4];
    const unsigned char* ql = b + 64 * n + (r & 63);
    const unsigned char* qh = b + 128 + 32 * n + (r & 31);
    int lshift = (r >> 6) * 4, hshift = (r >> 5) * 2;
    for (int i = 0; i < 8; ++i) {
        int q = ((ql[i] >> lshift) & 15) | (((qh[i] >> hshift) & 3) << 4);
        v[i] = d * (float)(q - 32);
    }
}
