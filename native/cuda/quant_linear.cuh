// quant_linear.cuh: the quant.cuh traits of the types whose weights are linear in their codes
// (scale * code + min): Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, TQ1_0, TQ2_0. Same interface as quant.cuh.
// Alignment: Q4_1 and Q2_K blocks (20, 84 bytes) sit on 4 bytes, Q5_1 (24) on 8; Q5_0, Q3_K,
// TQ1_0 and TQ2_0 blocks (22, 110, 54, 66) only on 2, so their bytes are read as 16-bit words or
// as the aligned words around them (fm_words).
#pragma once
#include "quant_core.cuh"

// the aligned words around n <= 8 bytes at p, of any alignment, into w[0..2]: a word that holds
// none of the n bytes is not read (it may lie past the tensor), its w is 0
FM_HD void fm_words(const unsigned char* p, int n, unsigned int* w) {
    const int off = (int)((size_t)p & 3);
    const unsigned char* a = p - off;
    w[0] = fm_ld4(a);
    w[1] = off + n > 4 ? fm_ld4(a + 4) : 0u;
    w[2] = off + n > 8 ? fm_ld4(a + 8) : 0u;
}

// bytes off .. off + 7 of the words from fm_words (off: the bytes' start within w[0], 0-3)
FM_HD uint2 fm_bytes8(const unsigned int* w, unsigned int off) {
    const unsigned int s = 0x3210u + 0x1111u * off;
    return make_uint2(fm_prmt(w[0], w[1], s), fm_prmt(w[1], w[2], s));
}

// ---------------------------------------------------------------------------- 32-element blocks
// Q4_1 and Q5_1 open their BYTES-byte blocks with {f16 d, m}: scale d and min m
template <int BYTES>
struct QT_dm32_scale {
    struct scale { float d, m; };
    static const int SPAN = 32;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const unsigned int dm = fm_ld4(row + (k >> 5) * BYTES);
        sc.d = fm_half_to_float(dm & 0xffffu);
        sc.m = fm_half_to_float(dm >> 16);
    }
};

// Q4_1: {f16 d, m; u8 qs[16]}, 20 bytes; nibbles as Q4_0, value d * q + m
struct QT_q4_1 : QT_dm32_scale<20> {
    struct raw { uint2 qs; };
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* q = row + (k >> 5) * 20 + 4 + (k & 15);
        r.qs = make_uint2(fm_ld4(q), fm_ld4(q + 4));
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        const int shift = ((k & 31) >> 4) * 4;
        const uint2 q = make_uint2((r.qs.x >> shift) & 0x0f0f0f0fu, (r.qs.y >> shift) & 0x0f0f0f0fu);
        for (int i = 0; i < 8; ++i) v[i * st] = sc.d * fm_w2f(q, i, 0.0f) + sc.m;
    }
};

// Q5_0: {f16 d; u8 qh[4]; u8 qs[16]}, 22 bytes; nibbles as Q4_0, the fifth bit of element j is
// bit j of qh; value d * (q - 16)
struct QT_q5_0 {
    struct scale { float d; };
    struct raw { unsigned int q[4], h; };            // 16-bit words of qs; the qh byte of the 8
    static const int SPAN = 32;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        sc.d = fm_half_to_float(fm_ld2(row + (k >> 5) * 22));
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* b = row + (k >> 5) * 22;
        for (int i = 0; i < 4; ++i) r.q[i] = fm_ld2(b + 6 + (k & 15) + 2 * i);
        r.h = b[2 + ((k & 31) >> 3)];
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        const int shift = ((k & 31) >> 4) * 4;
        for (int i = 0; i < 4; ++i) {
            const unsigned int q = r.q[i] >> shift;
            v[(2 * i) * st] = sc.d * fm_q2f((q & 15) | (((r.h >> (2 * i)) & 1) << 4), 16.0f);
            v[(2 * i + 1) * st] = sc.d * fm_q2f(((q >> 8) & 15) | (((r.h >> (2 * i + 1)) & 1) << 4), 16.0f);
        }
    }
};

// Q5_1: {f16 d, m; u8 qh[4]; u8 qs[16]}, 24 bytes; Q5_0's codes, value d * q + m
struct QT_q5_1 : QT_dm32_scale<24> {
    struct raw { uint2 qs; unsigned int h; };
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* b = row + (k >> 5) * 24;
        r.qs = fm_ld8(b + 8 + (k & 15));
        r.h = b[4 + ((k & 31) >> 3)];
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        const int shift = ((k & 31) >> 4) * 4;
        for (int i = 0; i < 8; ++i) {
            const unsigned int w = i < 4 ? r.qs.x : r.qs.y;
            const unsigned int q = ((w >> (8 * (i & 3) + shift)) & 15) | (((r.h >> i) & 1) << 4);
            v[i * st] = sc.d * fm_q2f(q, 0.0f) + sc.m;
        }
    }
};

// ---------------------------------------------------------------------------- 256-element super-blocks
// Q2_K: {u8 scales[16]; u8 qs[64]; f16 d, dmin}, 84 bytes. Element e: bits 2*((e%128)/32) of
// qs[32*(e/128) + e%32]; sub-block e/16 has scale d * (scales & 15) and min dmin * (scales >> 4)
struct QT_q2_k {
    struct scale { float d, m; };
    struct raw { unsigned int q[2]; };
    static const int SPAN = 16;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const unsigned char* b = row + (k >> 8) * 84;
        const unsigned int s = b[(k & 255) >> 4], dm = fm_ld4(b + 80);
        sc.d = fm_half_to_float(dm & 0xffffu) * (float)(s & 15);
        sc.m = fm_half_to_float(dm >> 16) * (float)(s >> 4);
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const int e = k & 255;
        const unsigned char* q = row + (k >> 8) * 84 + 16 + 32 * (e >> 7) + (e & 31);
        r.q[0] = fm_ld4(q);
        r.q[1] = fm_ld4(q + 4);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        const int shift = 2 * ((k & 127) >> 5);
        const uint2 q = make_uint2((r.q[0] >> shift) & 0x03030303u, (r.q[1] >> shift) & 0x03030303u);
        for (int i = 0; i < 8; ++i) v[i * st] = sc.d * fm_w2f(q, i, 0.0f) - sc.m;
    }
};

// Q3_K: {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}, 110 bytes. Element e: 2 low bits as
// Q2_K's (at qs), minus 4 unless bit e/32 of hmask[e%32] is set; sub-block s = e/16 has the
// 6-bit signed scale (scales[s%8] >> 4*(s/8)) & 15 | ((scales[8 + s%4] >> 2*(s/4)) & 3) << 4, - 32
struct QT_q3_k {
    struct scale { float d; unsigned int off; };     // off: the block's start within its word
    struct raw { unsigned int ql[3], qh[3]; };
    static const int SPAN = 16;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const unsigned char* b = row + (k >> 8) * 110;
        const int s = (k & 255) >> 4;
        const unsigned int lo = (b[96 + (s & 7)] >> (4 * (s >> 3))) & 15, hi = (b[104 + (s & 3)] >> (2 * (s >> 2))) & 3;
        sc.d = fm_half_to_float(fm_ld2(b + 108)) * (float)((int)(lo | (hi << 4)) - 32);
        sc.off = (unsigned int)((size_t)b & 2);
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* b = row + (k >> 8) * 110;
        const int e = k & 255;
        q6_words(b + 32 + 32 * (e >> 7) + (e & 31), r.ql);
        q6_words(b + (e & 31), r.qh);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        const int e = k & 255, lshift = 2 * ((e & 127) >> 5), hshift = e >> 5;
        const uint2 ql = q6_bytes(r.ql, sc.off), qh = q6_bytes(r.qh, sc.off);
        const uint2 q = make_uint2(((ql.x >> lshift) & 0x03030303u) | (((qh.x >> hshift) << 2) & 0x04040404u),
                                   ((ql.y >> lshift) & 0x03030303u) | (((qh.y >> hshift) << 2) & 0x04040404u));
        for (int i = 0; i < 8; ++i) v[i * st] = sc.d * fm_w2f(q, i, 4.0f);
    }
};

// TQ2_0: {u8 qs[64]; f16 d}, 66 bytes; Q2_K's code layout, value d * (q - 1)
struct QT_tq2_0 {
    struct scale { float d; unsigned int off; };
    struct raw { unsigned int q[3]; };
    static const int SPAN = 256;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const unsigned char* b = row + (k >> 8) * 66;
        sc.d = fm_half_to_float(fm_ld2(b + 64));
        sc.off = (unsigned int)((size_t)b & 2);
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const int e = k & 255;
        q6_words(row + (k >> 8) * 66 + 32 * (e >> 7) + (e & 31), r.q);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        const int shift = 2 * ((k & 127) >> 5);
        const uint2 b = q6_bytes(r.q, sc.off);
        const uint2 q = make_uint2((b.x >> shift) & 0x03030303u, (b.y >> shift) & 0x03030303u);
        for (int i = 0; i < 8; ++i) v[i * st] = sc.d * fm_w2f(q, i, 1.0f);
    }
};

// TQ1_0: {u8 qs[48]; u8 qh[4]; f16 d}, 54 bytes; five ternary digits per byte, digit m of byte x
// read as ((x * 3^m mod 256) * 3) >> 8. Elements 0-159: digit e/32 of qs[e%32]; 160-239: digit
// (e-160)/16 of qs[32 + e%16]; 240-255: digit (e-240)/4 of qh[e%4]. Value d * (digit - 1)
struct QT_tq1_0 {
    struct scale { float d; };
    struct raw { unsigned int w[3], off; };
    static const int SPAN = 256;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        sc.d = fm_half_to_float(fm_ld2(row + (k >> 8) * 54 + 52));
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const int e = k & 255;
        const unsigned char* p = row + (k >> 8) * 54 + (e < 160 ? (e & 31) : e < 240 ? 32 + (e & 15) : 48);
        fm_words(p, e < 240 ? 8 : 4, r.w);
        r.off = (unsigned int)((size_t)p & 3);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        const int e = k & 255;
        const unsigned int m = e < 160 ? e >> 5 : e < 240 ? (e - 160) >> 4 : (e - 240) >> 2;
        const unsigned int p0 = m == 0 ? 1u : m == 1 ? 3u : m == 2 ? 9u : m == 3 ? 27u : 81u;
        uint2 x = fm_bytes8(r.w, r.off);
        if (e >= 240) x.y = x.x;                     // qh's 4 bytes, at digits m and m + 1
        for (int i = 0; i < 8; ++i) {
            const unsigned int p = e >= 240 && i >= 4 ? 3 * p0 : p0;
            const unsigned int t = (fm_byte(i < 4 ? x.x : x.y, i & 3) * p) & 255u;
            v[i * st] = sc.d * fm_q2f((t * 3) >> 8, 1.0f);
        }
    }
};
