// quant_iq.cuh: the quant.cuh traits of the code-book and grid types: IQ4_NL, IQ4_XS, MXFP4
// (4-bit codes into a 16-entry book), IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (grid entries of 8
// or 4 magnitudes with sign patterns), IQ1_S, IQ1_M (ternary grid entries plus a shift).
// The tables are native/iq_tables.h's, twice: as __device__ globals for the kernels (L1-cached
// loads; constant memory would serialize a warp's distinct indices; not const, which nvcc turns
// into sm_35's read-only loads) and as host arrays for the host builds. FM_IQ(name) is the one a function sees. A group of 8 weights of a grid type is one
// grid entry (or two of 4); a trait loads its index bits, and decode looks the entry up.
// Alignment: IQ4_XS (136 bytes) and IQ1_M (56) blocks sit on 8 bytes; MXFP4 (17) on 1 (read as
// the aligned words around, fm_words); the others on 2 (16-bit words and bytes).
#pragma once
#include "quant_core.cuh"
#include <stdint.h>

#ifdef __CUDACC__
namespace fm_dev {
#define FM_IQ_TABLE __device__
#include "../iq_tables.h"
#undef FM_IQ_TABLE
#undef FERMIUM_IQ_TABLES_H
}
#endif
#define FM_IQ_TABLE static const
#include "../iq_tables.h"
#undef FM_IQ_TABLE

#ifdef __CUDA_ARCH__
#define FM_IQ(name) fm_dev::name
#else
#define FM_IQ(name) name
#endif

FM_HD uint2 fm_grid8(const uint64_t* grid, unsigned int i) {
    const uint64_t g = grid[i];
    return make_uint2((unsigned int)g, (unsigned int)(g >> 32));
}

// v[i] = d * value i of the grid entry g, negated where bit i of signs is set
FM_HD void fm_signed8(uint2 g, unsigned int signs, float d, float* v, int st) {
    for (int i = 0; i < 8; ++i) v[i * st] = ((signs >> i) & 1 ? -d : d) * fm_w2f(g, i, 0.0f);
}

// ---------------------------------------------------------------------------- code books
// IQ4_NL: Q4_0's block and nibble order ({f16 d; u8 qs[16]}, 18 bytes), value d * kvalues_iq4nl[q]
struct QT_iq4_nl : QT_q4_0 {
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        const int shift = ((k & 31) >> 4) * 4;
        for (int i = 0; i < 4; ++i) {
            const unsigned int q = r.q[i] >> shift;
            v[(2 * i) * st] = sc.d * (float)FM_IQ(fm_kvalues_iq4nl)[q & 15];
            v[(2 * i + 1) * st] = sc.d * (float)FM_IQ(fm_kvalues_iq4nl)[(q >> 8) & 15];
        }
    }
};

// v[i] = d * book[nibble i of q >> shift], q two words of 4 bytes
FM_HD void fm_book8(const int8_t* book, uint2 q, int shift, float d, float* v, int st) {
    for (int i = 0; i < 8; ++i) v[i * st] = d * (float)book[(fm_byte(i < 4 ? q.x : q.y, i & 3) >> shift) & 15];
}

// IQ4_XS: {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}, 136 bytes; sub-block j of 32 has
// scale d * ((scales_l[j/2] >> 4*(j%2)) & 15 | ((scales_h >> 2j) & 3) << 4, - 32) and reads
// qs[16j + l%16], low nibble for l < 16
struct QT_iq4_xs {
    struct scale { float d; };
    struct raw { uint2 qs; };
    static const int SPAN = 32;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const uint2 h = fm_ld8(row + (k >> 8) * 136);
        const int j = (k & 255) >> 5;
        const unsigned int s = ((fm_byte(h.y, j >> 1) >> (4 * (j & 1))) & 15) | (((h.x >> (16 + 2 * j)) & 3) << 4);
        sc.d = fm_half_to_float(h.x & 0xffffu) * (float)((int)s - 32);
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const int e = k & 255;
        r.qs = fm_ld8(row + (k >> 8) * 136 + 8 + 16 * (e >> 5) + (e & 15));
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        fm_book8(FM_IQ(fm_kvalues_iq4nl), r.qs, ((k & 31) >> 4) * 4, sc.d, v, st);
    }
};

// MXFP4: {u8 e; u8 qs[16]}, 17 bytes; Q4_0's nibbles into the doubled E2M1 values, scale the
// E8M0 exponent halved: 2^(e - 128), as bits
struct QT_mxfp4 {
    struct scale { float d; };
    struct raw { unsigned int w[3], off; };
    static const int SPAN = 32;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const unsigned int e = row[(k >> 5) * 17];
        sc.d = fm_bits_to_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* p = row + (k >> 5) * 17 + 1 + (k & 15);
        fm_words(p, 8, r.w);
        r.off = (unsigned int)((size_t)p & 3);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int k, float* v, int st) {
        fm_book8(FM_IQ(fm_kvalues_mxfp4), fm_bytes8(r.w, r.off), ((k & 31) >> 4) * 4, sc.d, v, st);
    }
};

// ---------------------------------------------------------------------------- 2-bit grids
// the grid scale of IQ2_XXS/XS/S: d * (0.5 + s) * 0.25, in gguf's order
FM_HD float fm_iq2_scale(const unsigned char* b, unsigned int s) {
    return fm_half_to_float(fm_ld2(b)) * (0.5f + (float)s) * 0.25f;
}

// IQ2_XXS: {f16 d; u32 pairs[8][2]}, 66 bytes. Per 32 elements a pair: 4 grid indices (bytes of
// the first word), and in the second 4 sign indices of 7 bits (into ksigns) and the scale (top 4)
struct QT_iq2_xxs {
    struct scale { float d; };
    struct raw { unsigned int q; };                  // grid index | sign index << 8
    static const int SPAN = 32;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const unsigned char* b = row + (k >> 8) * 66;
        sc.d = fm_iq2_scale(b, fm_ld2(b + 2 + 8 * ((k & 255) >> 5) + 6) >> 12);
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* p = row + (k >> 8) * 66 + 2 + 8 * ((k & 255) >> 5);
        const int l = (k & 31) >> 3;
        const unsigned int aux = fm_ld2(p + 4) | (fm_ld2(p + 6) << 16);
        r.q = p[l] | (((aux >> (7 * l)) & 127) << 8);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int, float* v, int st) {
        fm_signed8(fm_grid8(FM_IQ(fm_iq2xxs_grid), r.q & 255), FM_IQ(fm_ksigns_iq2xs)[r.q >> 8], sc.d, v, st);
    }
};

// IQ2_XS: {f16 d; u16 qs[32]; u8 scales[8]}, 74 bytes. Group g of 8: qs[g] holds the grid index
// (9 bits) and the sign index (7); 4-bit scale per 16, (scales[s/2] >> 4*(s%2)) & 15
struct QT_iq2_xs {
    struct scale { float d; };
    struct raw { unsigned int q; };
    static const int SPAN = 16;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const unsigned char* b = row + (k >> 8) * 74;
        const int s = (k & 255) >> 4;
        sc.d = fm_iq2_scale(b, (b[66 + (s >> 1)] >> (4 * (s & 1))) & 15);
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        r.q = fm_ld2(row + (k >> 8) * 74 + 2 + 2 * ((k & 255) >> 3));
    }
    static FM_HD void decode(const raw& r, const scale& sc, int, float* v, int st) {
        fm_signed8(fm_grid8(FM_IQ(fm_iq2xs_grid), r.q & 511), FM_IQ(fm_ksigns_iq2xs)[r.q >> 9], sc.d, v, st);
    }
};

// IQ2_S: {f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8]}, 82 bytes. Group g: grid index
// qs[g] | ((qh[g/4] >> 2*(g%4)) & 3) << 8, signs[g] the signs; scales as IQ2_XS
struct QT_iq2_s {
    struct scale { float d; };
    struct raw { unsigned int q; };                  // grid index | signs << 10
    static const int SPAN = 16;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const unsigned char* b = row + (k >> 8) * 82;
        const int s = (k & 255) >> 4;
        sc.d = fm_iq2_scale(b, (b[74 + (s >> 1)] >> (4 * (s & 1))) & 15);
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* b = row + (k >> 8) * 82;
        const int g = (k & 255) >> 3;
        r.q = b[2 + g] | (((b[66 + (g >> 2)] >> (2 * (g & 3))) & 3) << 8) | ((unsigned int)b[34 + g] << 10);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int, float* v, int st) {
        fm_signed8(fm_grid8(FM_IQ(fm_iq2s_grid), r.q & 1023), r.q >> 10, sc.d, v, st);
    }
};

// ---------------------------------------------------------------------------- 3-bit grids
// IQ3_XXS: {f16 d; u8 qs[64]; u32 aux[8]}, 98 bytes. Group g of 8: grid entries qs[2g], qs[2g+1]
// (4 values each); aux[g/4] holds the sign index (7 bits at 7*(g%4)) and, top 4, the scale
// d * (0.5 + s) * 0.5
struct QT_iq3_xxs {
    struct scale { float d; };
    struct raw { unsigned int q; };                  // two grid indices | sign index << 16
    static const int SPAN = 32;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const unsigned char* b = row + (k >> 8) * 98;
        const unsigned int s = fm_ld2(b + 66 + 4 * ((k & 255) >> 5) + 2) >> 12;
        sc.d = fm_half_to_float(fm_ld2(b)) * (0.5f + (float)s) * 0.5f;
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* b = row + (k >> 8) * 98;
        const int g = (k & 255) >> 3;
        const unsigned char* a = b + 66 + 4 * (g >> 2);
        const unsigned int aux = fm_ld2(a) | (fm_ld2(a + 2) << 16);
        r.q = fm_ld2(b + 2 + 2 * g) | (((aux >> (7 * (g & 3))) & 127) << 16);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int, float* v, int st) {
        const uint2 g = make_uint2(FM_IQ(fm_iq3xxs_grid)[r.q & 255], FM_IQ(fm_iq3xxs_grid)[(r.q >> 8) & 255]);
        fm_signed8(g, FM_IQ(fm_ksigns_iq2xs)[r.q >> 16], sc.d, v, st);
    }
};

// IQ3_S: {f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]}, 110 bytes. Entry j's index is
// qs[j] | bit j%8 of qh[j/8] << 8; group g is entries 2g, 2g+1 with signs[g]; scale per 32:
// d * (1 + 2 * ((scales[s/2] >> 4*(s%2)) & 15))
struct QT_iq3_s {
    struct scale { float d; };
    struct raw { unsigned int q; };                  // index 2g | index 2g+1 << 9 | signs << 18
    static const int SPAN = 32;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const unsigned char* b = row + (k >> 8) * 110;
        const int s = (k & 255) >> 5;
        sc.d = fm_half_to_float(fm_ld2(b)) * (float)(1 + 2 * ((b[106 + (s >> 1)] >> (4 * (s & 1))) & 15));
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* b = row + (k >> 8) * 110;
        const int g = (k & 255) >> 3;
        const unsigned int qs = fm_ld2(b + 2 + 2 * g), h = b[66 + (g >> 2)] >> (2 * (g & 3));
        r.q = (qs & 255) | ((h & 1) << 8) | ((qs >> 8) << 9) | (((h >> 1) & 1) << 17) | ((unsigned int)b[74 + g] << 18);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int, float* v, int st) {
        const uint2 g = make_uint2(FM_IQ(fm_iq3s_grid)[r.q & 511], FM_IQ(fm_iq3s_grid)[(r.q >> 9) & 511]);
        fm_signed8(g, r.q >> 18, sc.d, v, st);
    }
};

// ---------------------------------------------------------------------------- 1-bit grids
// v[i] = d * (value i of ternary grid entry idx + delta): grid values are -1, 0, 1 as int8
FM_HD void fm_iq1_8(unsigned int idx, float delta, float d, float* v, int st) {
    const uint2 g = fm_grid8(FM_IQ(fm_iq1s_grid), idx);
    for (int i = 0; i < 8; ++i) v[i * st] = d * ((float)fm_sbyte(i < 4 ? g.x : g.y, i & 3) + delta);
}

// IQ1_S: {f16 d; u8 qs[32]; u16 qh[8]}, 50 bytes. Per 32 elements qh[j]: 3 index bits per group
// (at 3*(g%4)), the scale d * (2 * ((qh >> 12) & 7) + 1), the shift's sign (bit 15)
struct QT_iq1_s {
    struct scale { float d, delta; };
    struct raw { unsigned int q; };
    static const int SPAN = 32;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const unsigned char* b = row + (k >> 8) * 50;
        const unsigned int h = fm_ld2(b + 34 + 2 * ((k & 255) >> 5));
        sc.d = fm_half_to_float(fm_ld2(b)) * (float)(2 * ((h >> 12) & 7) + 1);
        sc.delta = h & 0x8000u ? -FM_IQ1S_DELTA : FM_IQ1S_DELTA;
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* b = row + (k >> 8) * 50;
        const int g = (k & 255) >> 3;
        r.q = b[2 + g] | (((fm_ld2(b + 34 + 2 * (g >> 2)) >> (3 * (g & 3))) & 7) << 8);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int, float* v, int st) {
        fm_iq1_8(r.q, sc.delta, sc.d, v, st);
    }
};

// IQ1_M: {u8 qs[32]; u8 qh[16]; u16 scales[4]}, 56 bytes. Group g: index qs[g] | (nibble & 7) << 8,
// shift sign nibble & 8, the nibble g%2 of qh[g/2]; per 16 a 3-bit scale (bits 3*(s%4) of
// scales[s/4]): d * (2s + 1), d the f16 made of the four words' top nibbles
struct QT_iq1_m {
    struct scale { float d; };
    struct raw { unsigned int q; };                  // index | shift sign << 11
    static const int SPAN = 16;
    static FM_HD void load_scale(const unsigned char* row, int k, scale& sc) {
        const uint2 w = fm_ld8(row + (k >> 8) * 56 + 48);
        const unsigned int d = ((w.x >> 12) & 15) | ((w.x >> 28) << 4) | (((w.y >> 12) & 15) << 8) | ((w.y >> 28) << 12);
        const int s = (k & 255) >> 4;
        const unsigned int s3 = ((s < 8 ? w.x : w.y) >> (16 * ((s >> 2) & 1) + 3 * (s & 3))) & 7;
        sc.d = fm_half_to_float(d) * (float)(2 * s3 + 1);
    }
    static FM_HD void load(const unsigned char* row, int k, raw& r) {
        const unsigned char* b = row + (k >> 8) * 56;
        const int g = (k & 255) >> 3;
        r.q = b[g] | (((b[32 + (g >> 1)] >> (4 * (g & 1))) & 15) << 8);
    }
    static FM_HD void decode(const raw& r, const scale& sc, int, float* v, int st) {
        fm_iq1_8(r.q & 2047, r.q & 2048 ? -FM_IQ1S_DELTA : FM_IQ1S_DELTA, sc.d, v, st);
    }
};
