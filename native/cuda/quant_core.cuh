// quant_core.cuh: the aligned loads and word helpers that every trait of quant.cuh reads its
// quants with, and the traits of the plain floats (f32, f16, bf16), the 32-element blocks (Q8_0,
// Q4_0) and the K-quant super-blocks (Q4_K, Q5_K, Q6_K). quant_linear.cuh and quant_iq.cuh build
// on these; quant.cuh gathers them all.
#pragma once
#include "fermi.cuh"

// ---------------------------------------------------------------------------- aligned loads
// a T at p: one aligned load on the device; memcpy on the host, where p may be unaligned
template <typename T>
FM_HD T fm_ld(const unsigned char* p) {
#ifdef __CUDA_ARCH__
    return *(const T*)p;
#else
    T v;
    memcpy(&v, p, sizeof(T));
    return v;
#endif
}

FM_HD uint4 fm_ld16(const unsigned char* p) { return fm_ld<uint4>(p); }
FM_HD uint2 fm_ld8(const unsigned char* p) { return fm_ld<uint2>(p); }
FM_HD unsigned int fm_ld4(const unsigned char* p) { return fm_ld<unsigned int>(p); }
FM_HD unsigned int fm_ld2(const unsigned char* p) { return fm_ld<unsigned short>(p); }

FM_HD unsigned int fm_byte(unsigned int w, int i) { return (w >> (8 * i)) & 255u; }
FM_HD int fm_sbyte(unsigned int w, int i) { return (int)(w << (24 - 8 * i)) >> 24; }   // signed byte i

// (float)(q - c) for 0 <= q < 2^23, exactly: q in the mantissa of 2^23, then 2^23 + c subtracted
// (an integer op and an add rather than a conversion, which runs at a quarter of the FMA rate)
FM_HD float fm_q2f(unsigned int q, float c) { return fm_bits_to_float(0x4b000000u | q) - (8388608.0f + c); }

// __byte_perm (prmt, sm_20): byte n of the result is byte (s >> 4n) & 7 of {x, y}, x the low word
FM_HD unsigned int fm_prmt(unsigned int x, unsigned int y, unsigned int s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const unsigned long long xy = ((unsigned long long)y << 32) | x;
    unsigned int r = 0;
    for (int n = 0; n < 4; ++n) r |= (unsigned int)((xy >> (8 * ((s >> (4 * n)) & 7))) & 255u) << (8 * n);
    return r;
#endif
}

// fm_q2f of byte i of w: one permute puts the byte under the exponent (no shift and mask per byte)
FM_HD float fm_b2f(unsigned int w, int i, float c) {
    return fm_bits_to_float(fm_prmt(w, 0x4b000000u, 0x7440u + i)) - (8388608.0f + c);
}
FM_HD float fm_w2f(uint2 w, int i, float c) { return i < 4 ? fm_b2f(w.x, i, c) : fm_b2f(w.y, i - 4, c); }

// ---------------------------------------------------------------------------- plain floats
struct QT_none { struct scale {}; static const int SPAN = 1 << 30;
                 static FM_HD void load_scale(const unsigned char*, int, scale&) {} };

struct QT_f32 : QT_none {
    struct raw { uint4 a, b; };
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        r.a = fm_ld16(row + 4 * k);
        r.b = fm_ld16(row + 4 * k + 16);
    }
    static FM_HD void decode(const raw& r, const scale&, int, float* v, int st) {
        const unsigned int w[8] = {r.a.x, r.a.y, r.a.z, r.a.w, r.b.x, r.b.y, r.b.z, r.b.w};
        for (int i = 0; i < 8; ++i) v[i * st] = fm_bits_to_float(w[i]);
    }
};

// two 16-bit values per word, low half first
struct QT_f16 : QT_none {
    struct raw { uint4 a; };
    static FM_HD void load(const unsigned char* row, int k, raw& r) { r.a = fm_ld16(row + 2 * k); }
    static FM_HD void decode(const raw& r, const scale&, int, float* v, int st) {
        const unsigned int w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
        for (int i = 0; i < 4; ++i) {
            v[(2 * i) * st] = fm_half_to_float(w[i] & 0xffffu);
            v[(2 * i + 1) * st] = fm_half_to_float(w[i] >> 16);
        }
    }
};

struct QT_bf16 : QT_none {
    struct raw { uint4 a; };
    static FM_HD void load(const unsigned char* row, int k, raw& r) { r.a = fm_ld16(row + 2 * k); }
    static FM_HD void decode(const raw& r, const scale&, int, float* v, int st) {
        const unsigned int w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
        for (int i = 0; i < 4; ++i) {
            v[(2 * i) * st] = fm_bits_to_float(w[i] << 16);
            v[(2 * i + 1) * st] = fm_bits_to_float(w[i] & 0xffff0000u);
        }
    }
};

// ---------------------------------------------------------------------------- 32-element blocks
// Q8_0: {f16 d; int8 q[32]}, 34 bytes
struct QT_q8_0 {
    struct scale { float d; };
    struct raw { unsigned int q[4]; };               // 16-bit words, two int8 each
    static const int SPAN = 32;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        sc.d = fm_half_to_float(fm_ld2(row + (k >> 5) * 34));
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* q = row + (k >> 5) * 34 + 2 + (k & 31);
        for (int i = 0; i < 4; ++i) r.q[i] = fm_ld2(q + 2 * i);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int, float* v, int st) {
        for (int i = 0; i < 4; ++i) {                // int8 b as (b ^ 128) - 128
            v[(2 * i) * st] = sc.d * fm_q2f((r.q[i] & 255u) ^ 128u, 128.0f);
            v[(2 * i + 1) * st] = sc.d * fm_q2f((r.q[i] >> 8) ^ 128u, 128.0f);
        }
    }
};

// Q4_0: {f16 d; u8 qs[16]}, 18 bytes; element j < 16 is the low nibble of qs[j], j >= 16 the high one of qs[j-16]
struct QT_q4_0 {
    struct scale { float d; };
    struct raw { unsigned int q[4]; };
    static const int SPAN = 32;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        sc.d = fm_half_to_float(fm_ld2(row + (k >> 5) * 18));
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* q = row + (k >> 5) * 18 + 2 + (k & 15);
        for (int i = 0; i < 4; ++i) r.q[i] = fm_ld2(q + 2 * i);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        const int shift = ((k & 31) >> 4) * 4;
        for (int i = 0; i < 4; ++i) {
            const unsigned int q = r.q[i] >> shift;
            v[(2 * i) * st] = sc.d * fm_q2f(q & 15, 8.0f);
            v[(2 * i + 1) * st] = sc.d * fm_q2f((q >> 8) & 15, 8.0f);
        }
    }
};

// ---------------------------------------------------------------------------- 256-element super-blocks
// Q4_K and Q5_K share {f16 d, dmin; u8 scales[12]} at the block's start: sub-block j's scale
// d * (6-bit sc) and min dmin * (6-bit mn), from the 12 packed bytes read as three words
struct QT_k4_scale {
    struct scale { float d, m; };
    static const int SPAN = 32;
    static FM_HD void load_scale(const unsigned char* b, int j, scale& out) {
        const unsigned int dm = fm_ld4(b), s0 = fm_ld4(b + 4), s1 = fm_ld4(b + 8), s2 = fm_ld4(b + 12);
        unsigned int sc, mn;
        if (j < 4) {
            sc = fm_byte(s0, j) & 63;
            mn = fm_byte(s1, j) & 63;
        } else {
            sc = (fm_byte(s2, j - 4) & 15) | ((fm_byte(s0, j - 4) >> 6) << 4);
            mn = (fm_byte(s2, j - 4) >> 4) | ((fm_byte(s1, j - 4) >> 6) << 4);
        }
        out.d = fm_half_to_float(dm & 0xffffu) * (float)sc;
        out.m = fm_half_to_float(dm >> 16) * (float)mn;
    }
};

// Q4_K: {f16 d, dmin; u8 scales[12]; u8 qs[128]}, 144 bytes; sub-block j of 32 reads
// qs[32*(j/2) + l] low nibble (j even) or high nibble (j odd)
struct QT_q4_k : QT_k4_scale {
    struct raw { uint2 qs; };
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        QT_k4_scale::load_scale(row + (k >> 8) * 144, (k & 255) >> 5, sc);
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const int e = k & 255;
        r.qs = fm_ld8(row + (k >> 8) * 144 + 16 + 32 * (e >> 6) + (e & 31));
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        const int shift = ((k >> 5) & 1) * 4;
        const uint2 q = make_uint2((r.qs.x >> shift) & 0x0f0f0f0fu, (r.qs.y >> shift) & 0x0f0f0f0fu);
        for (int i = 0; i < 8; ++i) v[i * st] = sc.d * fm_w2f(q, i, 0.0f) - sc.m;
    }
};

// Q5_K: {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}, 176 bytes; the fifth bit of
// element l of sub-block j is bit j of qh[l]
struct QT_q5_k : QT_k4_scale {
    struct raw { uint2 qh, qs; };
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        QT_k4_scale::load_scale(row + (k >> 8) * 176, (k & 255) >> 5, sc);
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* b = row + (k >> 8) * 176;
        const int e = k & 255;
        r.qh = fm_ld8(b + 16 + (e & 31));
        r.qs = fm_ld8(b + 48 + 32 * (e >> 6) + (e & 31));
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        const int j = (k & 255) >> 5, shift = (j & 1) * 4;
        const uint2 q = make_uint2(((r.qs.x >> shift) & 0x0f0f0f0fu) | (((r.qh.x >> j) << 4) & 0x10101010u),
                                   ((r.qs.y >> shift) & 0x0f0f0f0fu) | (((r.qh.y >> j) << 4) & 0x10101010u));
        for (int i = 0; i < 8; ++i) v[i * st] = sc.d * fm_w2f(q, i, 0.0f) - sc.m;
    }
};

// Q6_K: {u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d}, 210 bytes. In half n (128 elements)
// element r takes ql[64n + r%64] >> 4*(r/64) and qh[32n + r%32] >> 2*(r/32); scale per 16.
// Blocks are 2-byte aligned, so 8 bytes of ql or qh are read as the 3 aligned words around them.
FM_HD void q6_words(const unsigned char* p, unsigned int* w) {
    const unsigned char* a = p - ((size_t)p & 2);
    for (int i = 0; i < 3; ++i) w[i] = fm_ld4(a + 4 * i);
}

FM_HD uint2 q6_bytes(const unsigned int* w, unsigned int off) {      // off: 2 if the bytes start mid-word
    return off ? make_uint2((w[0] >> 16) | (w[1] << 16), (w[1] >> 16) | (w[2] << 16)) : make_uint2(w[0], w[1]);
}

struct QT_q6_k {
    struct scale { float d; unsigned int off; };     // off: the block's start within its word
    struct raw { unsigned int ql[3], qh[3]; };       // the 3 words around the 8 bytes of each
    static const int SPAN = 16;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const unsigned char* b = row + (k >> 8) * 210;
        sc.d = fm_half_to_float(fm_ld2(b + 208)) * (float)(signed char)b[192 + ((k & 255) >> 4)];
        sc.off = (unsigned int)((size_t)b & 2);
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* b = row + (k >> 8) * 210;
        const int e = k & 255, n = e >> 7, q = e & 127;
        q6_words(b + 64 * n + (q & 63), r.ql);
        q6_words(b + 128 + 32 * n + (q & 31), r.qh);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        const int e = k & 127, lshift = (e >> 6) * 4, hshift = (e >> 5) * 2;
        const uint2 ql = q6_bytes(r.ql, sc.off), qh = q6_bytes(r.qh, sc.off);
        const uint2 q = make_uint2(((ql.x >> lshift) & 0x0f0f0f0fu) | (((qh.x >> hshift) << 4) & 0x30303030u),
                                   ((ql.y >> lshift) & 0x0f0f0f0fu) | (((qh.y >> hshift) << 4) & 0x30303030u));
        for (int i = 0; i < 8; ++i) v[i * st] = sc.d * fm_w2f(q, i, 32.0f);
    }
};
