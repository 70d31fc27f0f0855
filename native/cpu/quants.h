/* Block layouts of the GGUF weight types the kernels read, the 8-bit activation blocks they
 * pair with, and the kernel signatures shared by every ISA sibling. Not a general ggml port:
 * only the types Fermium decodes with. */
#ifndef FERMIUM_QUANTS_H
#define FERMIUM_QUANTS_H

#include <stddef.h>
#include <stdint.h>

#define QK32 32
#define QK_K 256

typedef uint16_t fm_f16;

// ---- weight blocks (byte-exact GGUF layouts)
typedef struct { fm_f16 d; uint8_t qs[QK32 / 2]; } block_q4_0;              // 18 B
typedef struct { fm_f16 d; int8_t qs[QK32]; } block_q8_0;                   // 34 B
typedef struct { fm_f16 d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;  // 144 B
typedef struct { fm_f16 d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8];
                 uint8_t qs[QK_K / 2]; } block_q5_K;                          // 176 B
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16];
                 fm_f16 d; } block_q6_K;                                      // 210 B
// 2-bit i-quants: 8 values per grid entry (native/iq_tables.h), 4 entries per sub-block of 32.
// IQ2_XXS: per sub-block, qs holds 4 grid indices (bytes), then 4 x 7-bit sign indices (into
// fm_ksigns_iq2xs) and a 4-bit scale in the top bits of the next 32-bit word. IQ2_XS: qs holds
// 9-bit indices and 7-bit sign indices, scales a 4-bit scale per 16 values. IQ2_S: qs holds the
// low 8 bits of 10-bit indices, then the sign bytes; qh the top 2 bits. A value is
// d * (2 scale + 1) / 8 * grid byte * sign.
typedef struct { fm_f16 d; uint16_t qs[QK_K / 8]; } block_iq2_xxs;                         // 66 B
typedef struct { fm_f16 d; uint16_t qs[QK_K / 8]; uint8_t scales[QK_K / 32]; } block_iq2_xs;  // 74 B
typedef struct { fm_f16 d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t scales[QK_K / 32]; } block_iq2_s;  // 82 B
// the other 32-value blocks (q32_*.c): value j of a block is nibble j % 16 of qs, low nibbles
// first, with bit j of qh (little-endian) on top for the 5-bit types
typedef struct { fm_f16 d, m; uint8_t qs[QK32 / 2]; } block_q4_1;                       // 20 B
typedef struct { fm_f16 d; uint8_t qh[4]; uint8_t qs[QK32 / 2]; } block_q5_0;           // 22 B
typedef struct { fm_f16 d, m; uint8_t qh[4]; uint8_t qs[QK32 / 2]; } block_q5_1;        // 24 B
typedef struct { fm_f16 d; uint8_t qs[QK32 / 2]; } block_iq4_nl;                        // 18 B
typedef struct { uint8_t e; uint8_t qs[QK32 / 2]; } block_mxfp4;                        // 17 B
// the lower-bit super-blocks (lowbit_*.c): Q2_K, Q3_K, IQ4_XS, TQ2_0, TQ1_0
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; fm_f16 d, dmin; } block_q2_K;   // 84 B
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; fm_f16 d; } block_q3_K;   // 110 B
typedef struct { fm_f16 d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;   // 136 B
typedef struct { uint8_t qs[QK_K / 4]; fm_f16 d; } block_tq2_0;              // 66 B
typedef struct { uint8_t qs[(QK_K - 4 * QK_K / 64) / 5]; uint8_t qh[QK_K / 64]; fm_f16 d; } block_tq1_0;   // 54 B
_Static_assert(sizeof(block_q2_K) == 84 && sizeof(block_q3_K) == 110 && sizeof(block_iq4_xs) == 136 &&
               sizeof(block_tq2_0) == 66 && sizeof(block_tq1_0) == 54, "GGUF block sizes");
// i-quants of 3 and 1 bits (iq_lowbit.h decodes them; the grids are in native/iq_tables.h)
typedef struct { fm_f16 d; uint8_t qs[QK_K / 4]; uint8_t scales_signs[QK_K / 8]; } block_iq3_xxs;   // 98 B
typedef struct { fm_f16 d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t signs[QK_K / 8];
                 uint8_t scales[QK_K / 64]; } block_iq3_s;                    // 110 B
typedef struct { fm_f16 d; uint8_t qs[QK_K / 8]; uint16_t qh[QK_K / 32]; } block_iq1_s;   // 50 B
typedef struct { uint8_t qs[QK_K / 8]; uint8_t qh[QK_K / 16]; uint8_t scales[QK_K / 32]; } block_iq1_m;   // 56 B

// ---- activations, 8-bit with fp32 scales
// For Q4_0/Q8_0, a row of nb blocks of 32 is stored as arrays, so SIMD code loads several
// blocks' scales at once: qs (nb * 32 int8) | d (nb float) | s (nb float), s = d * sum(qs),
// padded to 16 bytes so that rows laid end to end all start aligned (below).
static inline const float *fm_a32_d(const void *a, int nb) { return (const float *)((const int8_t *)a + QK32 * nb); }
static inline const float *fm_a32_s(const void *a, int nb) { return fm_a32_d(a, nb) + nb; }
#define FM_A32_BYTES(nb) (((size_t)(nb) * (QK32 + 2 * sizeof(float)) + 15) & ~(size_t)15)
// For K-quants, blocks of 256 with the sums of each 16 values (Q6_K's sub-blocks) and of each 32
// (Q4_K's and Q5_K's: their mins dot takes them straight into one `pmaddwd`, where summing pairs
// of the 16-value sums took a `phaddw` per block); quants first and the block padded to 16
// bytes. So in a row that starts 16-byte aligned (every buffer here: malloc, the engine's arena,
// numpy through cpu_lib.aligned) the SSSE3 kernels of both kinds load the activation quants
// aligned, straight into `pmaddubsw` (SSE memory operands must be aligned).
typedef struct { int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; int16_t sums32[QK_K / 32]; float d; int32_t pad[3]; } block_a8_256;   // 320 B
_Static_assert(sizeof(block_a8_256) % 16 == 0, "activation blocks keep 16-byte alignment");

// GGML type ids (gguf.GGMLQuantizationType), and Fermium's own for a repacked layout (the same
// definition as in fermium_cpu.h, which cffi reads)
enum { FM_F32 = 0, FM_F16 = 1, FM_Q4_0 = 2, FM_Q8_0 = 8, FM_Q4_K = 12, FM_Q5_K = 13,
       FM_Q6_K = 14, FM_BF16 = 30 };
enum { FM_IQ2_XXS = 16, FM_IQ2_XS = 17, FM_IQ2_S = 22 };
enum { FM_Q4_1 = 3, FM_Q5_0 = 6, FM_Q5_1 = 7, FM_IQ4_NL = 20, FM_MXFP4 = 39 };
enum { FM_Q2_K = 10, FM_Q3_K = 11, FM_IQ4_XS = 23, FM_TQ1_0 = 34, FM_TQ2_0 = 35 };
enum { FM_IQ3_XXS = 18, FM_IQ1_S = 19, FM_IQ3_S = 21, FM_IQ1_M = 29 };
#define FM_Q4_0X8 258
#define FM_Q4_KX8 268
#define FM_Q6_KP 270
#define FM_Q4_0P 514
#define FM_Q4_KP 524

// ---- Q4_0 repacked for SIMD (repack.c): groups of FM_GROUP rows, interleaved in 4-byte pieces
// so that one 256-bit register holds 4 values of each of 8 rows, and the block scales of 8 rows
// are applied by one FMA instead of one per row and block. Block b of a group: the 8 rows'
// scales, then piece k (0..3) of every row: bytes 4k..4k+3 of its qs, that is values 4k..4k+3
// (low nibbles) and 16+4k..16+4k+3 (high nibbles). The same bytes as the 8 rows' Q4_0 blocks.
#define FM_GROUP 8
typedef struct { fm_f16 d[FM_GROUP]; uint8_t qs[4][FM_GROUP][4]; } block_q4_0x8;   // 144 B
// Q4_K of 8 rows, one super-block: the rows' d and dmin; byte c (0..11) of the packed scales of
// each row, by c then row (so one 16-byte load holds two bytes of all 8 rows); then for each
// 32-byte chunk j of qs (values 64j.. in the low nibbles, 64j + 32.. in the high) and piece k of
// 4 bytes, 8 rows x 4 bytes. The same bytes as the 8 rows' blocks.
typedef struct { fm_f16 d[FM_GROUP], dmin[FM_GROUP]; uint8_t scales[12][FM_GROUP];
                 uint8_t qs[4][8][FM_GROUP][4]; } block_q4_Kx8;   // 1152 B

// ---- Q6_K repacked for SIMD, row by row: the same 6-bit quants, scales and d, with the quants
// of each block reordered and their bits rearranged so that
//   - the 256 values are four 64-byte registers R0..R3, stored as three planes X, Y, Z that
//     decode, with 16-bit shifts, as
//       R0 = X & 63,  R1 = Y & 63,  R2 = (Z ^ X >> 2) & 63,  R3 = (Z >> 2 ^ Y >> 6) & 63:
//     9 vector operations (7 with `vpternlogd`), against 17 for the GGUF layout, and no program
//     of up to 4 shifts and xors before the 4 masks decodes every block (selftest/
//     q6_decode_search.c searches them all). The bits that
//     the shifts bring in from the other byte of a 16-bit lane are known once R0 and R1 are, so
//     the repack solves X's and Y's top two bits and Z from them (repack.c). A plain split
//     (X = R0 | R2.hi2 << 6, Z = R2.lo4 | R3.lo4 << 4, ...) took 11 operations, and SSSE3,
//     bound by its instructions, streamed slower so (AVX2 and AVX-512 keep the memory's pace
//     either way);
//   - bytes 4k..4k+3 of every register (every 16-byte lane: its 32-bit lane k % 4) hold values
//     of sub-block k: `vpdpbusd` sums all four registers into one 32-bit lane per sub-block,
//     scaled once per block (AVX-512), and in narrower registers two registers' `pmaddubsw`
//     products add up as int16 (2 * 2 * 63 * 128 < 32768) before one `pmaddwd` applies one
//     scale vector to both.
// The activations are stored in the same order (ACT_A8_256P), so SIMD loads line up; after the
// row's blocks they carry, per block and 16-byte lane q, the int16 vector of -32 times the sums
// of the activations under each int16 lane of the four registers' `pmaddubsw` products
// (fm_q6kp_offsets): added to those products it takes out the +32 of the stored quants, and the
// four products then add up as int16 (8 * 32 * 127 = 32512 < 32768 once offset; their wrapping
// sum lands there exactly) before one `pmaddwd` per lane applies the scales
// (q6_Kp_row_ssse3.c).
typedef struct { uint8_t planes[3][64]; int8_t scales[QK_K / 16]; fm_f16 d; } block_q6_Kp;   // 210 B

// the value (0..255, natural order) at position p = 64 R + j of a Q6_Kp block and its
// activations: value 4 R + j % 4 of sub-block j / 4
static inline int fm_q6kp_value(int p) {
    const int r = p / 64, j = p % 64;
    return 16 * (j / 4) + 4 * r + j % 4;
}

// ---- Q4_0 and Q4_K repacked for 128-bit registers, row by row: the same bytes, with the nibbles
// of four blocks (Q4_0) or sub-blocks (Q4_K) interleaved so that bytes 4m..4m+3 of every 16-byte
// register belong to block or sub-block m. The `pmaddubsw` products of all of a group's registers
// then add up as int16, lane by lane (lanes 2m and 2m+1 hold 16 values of block m at most:
// 16 * 15 * 128 = 30720 < 32768), and one `pmaddwd` turns them into a sum per block (Q4_0) or
// applies the scales (Q4_K), where the GGUF layout needs a horizontal reduction per block or a
// broadcast scale per sub-block (qx_0_row_ssse3.c, qx_K_row_ssse3.c). The activations are
// stored in the same order (ACT_A8_32P, ACT_A8_256K).
// Q4_0p: 4 consecutive blocks (128 values): their scales, then register j (0..3), byte k: byte
// 4j + k % 4 of the qs of block k / 4 (values 4j + k % 4 and 16 + 4j + k % 4 of that block).
#define QK_Q4_0P 128
typedef struct { fm_f16 d[4]; uint8_t qs[4][16]; } block_q4_0p;   // 72 B
// Q4_Kp: a Q4_K super-block (block_q4_K) whose qs hold, in register r (0..7), byte k: value
// 4r + k % 4 of sub-block k / 4 in the low nibble and of sub-block 4 + k / 4 in the high one.

// the value (natural order) that position p of a Q4_0p group (0..127) or a Q4_Kp block (0..255)
// and of its activations holds: p = 32 j + 16 h + k, with h 0 for low nibbles and 1 for high
static inline int fm_q4_0p_value(int p) {
    const int j = p / 32, h = p / 16 % 2, k = p % 16;
    return QK32 * (k / 4) + 16 * h + 4 * j + k % 4;
}
static inline int fm_q4kp_value(int p) {
    const int r = p / 32, h = p / 16 % 2, k = p % 16;
    return 32 * (4 * h + k / 4) + 4 * r + k % 4;
}

// the offset corrections of an ACT_A8_256P row of nb blocks: 4 x 8 int16 per block, after them
static inline const int16_t *fm_q6kp_offsets(const void *a, int nb) {
    return (const int16_t *)((const block_a8_256 *)a + nb);
}

// those of an ACT_A8_32P row of nb blocks of 32, after its quants, scales and sums: per group of
// 128 values, the int16 vector of -8 times the sums of the activations under each int16 lane of
// the group's 8 `pmaddubsw` products. Added to those products, it takes out the offset of 8 of
// the stored nibbles (|sum| <= 8 * 2 * 8 * 128 = 16384 once offset; their wrapping sum lands there
// exactly), where a multiply-add of the block sums by the scales took it out per group.
static inline const int16_t *fm_q4_0p_offsets(const void *a, int nb) {
    return (const int16_t *)((const uint8_t *)a + FM_A32_BYTES(nb));
}

// dot of one weight row (n values, n a multiple of the block) with one activation row
typedef float (*fm_vec_dot_fn)(int n, const void *w, const void *a);

float fm_f16_to_f32(fm_f16 h);
fm_f16 fm_f32_to_f16(float f);

// f16 -> f32 for block scales without F16C: every f16 value's float, filled from
// fm_f16_to_f32 when the library loads (float_row_generic.c). Two instructions and no branch,
// where a conversion in integer operations took about ten, in kernels bound by their instruction
// count (the SSSE3 row kernels of Q4_K and Q4_Kp stream faster with it). The floats are exact and
// never subnormal (a subnormal f16 is a normal float), so no float operation on them costs a
// microcode assist.
extern float fm_f16_table[1 << 16];
static inline float fm_half(fm_f16 h) { return fm_f16_table[h]; }

// an MXFP4 block's E8M0 exponent as the float 2^(e - 128): half the scale, as the code book
// fm_kvalues_mxfp4 holds twice the E2M1 values (GGML's GGML_E8M0_TO_FP32_HALF; subnormal for e < 2)
static inline float fm_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}

// the 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of a Q4_K/Q5_K super-block, unpacked
static inline void fm_unpack_scales_k4(const uint8_t *q, uint32_t out[4]) {
    uint32_t u0, u1, u2;
    __builtin_memcpy(&u0, q, 4);
    __builtin_memcpy(&u1, q + 4, 4);
    __builtin_memcpy(&u2, q + 8, 4);
    out[0] = u0 & 0x3F3F3F3Fu;
    out[1] = (u2 & 0x0F0F0F0Fu) | (((u0 >> 6) & 0x03030303u) << 4);
    out[2] = u1 & 0x3F3F3F3Fu;
    out[3] = ((u2 >> 4) & 0x0F0F0F0Fu) | (((u1 >> 6) & 0x03030303u) << 4);
}

// the 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block
static inline void fm_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// sum over the 8 sub-blocks of a Q4_K/Q5_K super-block of min * (sum of the 32 activations
// under it), from its packed scales and the activations' sums of each 16 values
static inline int fm_mins_dot_k4(const uint8_t *scales, const int16_t *bsums) {
    int s = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        fm_scale_min_k4(j, scales, &sc, &m);
        s += m * (bsums[2 * j] + bsums[2 * j + 1]);
    }
    return s;
}

// ---- software prefetch inside the kernels
// Each SIMD kernel requests the weights FM_PREFETCH_AHEAD bytes ahead of what it reads, one
// line per 64 bytes it consumes, spread through its block loop. A row's worth of requests
// issued at once before the row fills the core's line-fill buffers and stalls it, so compute
// and memory then take turns instead of overlapping. The distance covers the latency of a core
// that reads fast: half of it fell short there, and twice it gained nothing more
// (docs/performance.md). Another distance is built with -DFM_PREFETCH_AHEAD=N, to measure it
// (selftest/stream.c).
#ifndef FM_PREFETCH_AHEAD
#define FM_PREFETCH_AHEAD 8192
#endif
static inline __attribute__((always_inline)) void fm_prefetch_ahead(const void *at, size_t bytes) {
    const char *p = (const char *)at + FM_PREFETCH_AHEAD;
    _Pragma("GCC unroll 16")   // bytes is a block size, known where this inlines; -O2 left a loop
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

// ---- per-ISA kernel sets; every row of the dispatch table is one of these
#define FM_DECLARE_DOTS(isa) \
    float fm_dot_q4_0_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_q8_0_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_q4_K_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_q5_K_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_q6_K_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_q4_1_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_q5_0_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_q5_1_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_iq4_nl_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_mxfp4_a8_##isa(int n, const void *w, const void *a);
#define FM_DECLARE_FLOAT_DOTS(isa) \
    float fm_dot_f32_##isa(int n, const void *w, const void *a); \
    float fm_dot_f16_##isa(int n, const void *w, const void *a); \
    float fm_dot_bf16_##isa(int n, const void *w, const void *a);

FM_DECLARE_DOTS(generic)
FM_DECLARE_DOTS(ssse3)
FM_DECLARE_DOTS(avx2)
FM_DECLARE_DOTS(avx512)
#define FM_DECLARE_LOWBIT_DOTS(isa) \
    float fm_dot_q2_K_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_q3_K_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_iq4_xs_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_tq2_0_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_tq1_0_a8_##isa(int n, const void *w, const void *a);
FM_DECLARE_LOWBIT_DOTS(generic)
FM_DECLARE_LOWBIT_DOTS(ssse3)
FM_DECLARE_LOWBIT_DOTS(avx2)
FM_DECLARE_LOWBIT_DOTS(avx512)
#define FM_DECLARE_IQ_LOWBIT_DOTS(isa) \
    float fm_dot_iq3_xxs_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_iq3_s_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_iq1_s_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_iq1_m_a8_##isa(int n, const void *w, const void *a);
FM_DECLARE_IQ_LOWBIT_DOTS(generic)
FM_DECLARE_IQ_LOWBIT_DOTS(ssse3)
FM_DECLARE_IQ_LOWBIT_DOTS(avx2)
FM_DECLARE_IQ_LOWBIT_DOTS(avx512)
// one weight row . na <= FM_DOTN_MAX activation rows, results in out[0..na)
#define FM_DOTN_MAX 4
typedef void (*fm_vec_dot_n_fn)(int n, const void *w, const void *const *acts, int na, float *out);
// body(args..., na, out) with na (1..FM_DOTN_MAX) a constant: an instance of an inline kernel
// whose loops over activations are fully unrolled
#define FM_SWITCH_NA(body, ...)                                                         \
    switch (na) {                                                                       \
    case 1: body(__VA_ARGS__, 1, out); break;                                           \
    case 2: body(__VA_ARGS__, 2, out); break;                                           \
    case 3: body(__VA_ARGS__, 3, out); break;                                           \
    default: body(__VA_ARGS__, 4, out); break;                                          \
    }
// the entry point `name` of a batched kernel: na picks an instance of `body`
#define FM_DEFINE_DOTN(name, body, block_t)                                             \
    void name(int n, const void *w, const void *const *acts, int na, float *out) {      \
        FM_SWITCH_NA(body, n, (const block_t *)w, acts)                                 \
    }
// the one-row entry point `name` of a batched kernel: body's instance for one activation row
#define FM_DEFINE_DOT1(name, body, block_t)                                             \
    float name(int n, const void *w, const void *a) {                                   \
        float out;                                                                      \
        body(n, (const block_t *)w, &a, 1, &out);                                       \
        return out;                                                                     \
    }
void fm_dotn_q4_0_a8_avx2(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotn_q4_K_a8_avx2(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotn_q6_K_a8_avx2(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotn_f32_avx2(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotn_f16_avx2(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotn_bf16_avx2(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotn_q4_0_a8_avx512(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotn_q4_K_a8_avx512(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotn_q6_K_a8_avx512(int n, const void *w, const void *const *acts, int na, float *out);
#define FM_DECLARE_DOTN_Q32(isa) \
    void fm_dotn_q4_1_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_q5_0_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_q5_1_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_iq4_nl_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_mxfp4_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out);
FM_DECLARE_DOTN_Q32(avx2)
FM_DECLARE_DOTN_Q32(avx512)
#define FM_DECLARE_LOWBIT_DOTN(isa) \
    void fm_dotn_q2_K_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_q3_K_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_iq4_xs_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_tq2_0_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_tq1_0_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out);
FM_DECLARE_LOWBIT_DOTN(avx2)
FM_DECLARE_LOWBIT_DOTN(avx512)
#define FM_DECLARE_IQ_LOWBIT_DOTN(isa) \
    void fm_dotn_iq3_xxs_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_iq3_s_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_iq1_s_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_iq1_m_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out);
FM_DECLARE_IQ_LOWBIT_DOTN(avx2)
FM_DECLARE_IQ_LOWBIT_DOTN(avx512)
// AVX-512 VBMI: IQ3_XXS and IQ3_S (iq_lowbit_batch_avx512vbmi.c); its other kernels are AVX-512's
float fm_dot_iq3_xxs_a8_avx512vbmi(int n, const void *w, const void *a);
float fm_dot_iq3_s_a8_avx512vbmi(int n, const void *w, const void *a);
void fm_dotn_iq3_xxs_a8_avx512vbmi(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotn_iq3_s_a8_avx512vbmi(int n, const void *w, const void *const *acts, int na, float *out);
// nr (1..FM_DOTR_MAX) consecutive rows, row_bytes apart, . na (1..FM_DOTN_MAX) activation rows:
// out[i * FM_DOTR_MAX + r]. Where an ISA has one for a row layout, the driver takes rows this
// many at a time: they share each activation's loads and block sums. Two, as the streams of
// more rows side by side read slower from memory (docs/performance.md). The same definition as
// in fermium_cpu.h, which cffi reads
#define FM_DOTR_MAX 2
typedef void (*fm_vec_dot_r_fn)(int n, const void *w, size_t row_bytes, int nr, const void *const *acts, int na, float *out);
#define FM_DEFINE_DOTR(name, body)                                                      \
    void name(int n, const void *w, size_t row_bytes, int nr, const void *const *acts, int na, float *out) { \
        if (nr == 1) { FM_SWITCH_NA(body, n, (const uint8_t *)w, row_bytes, 1, acts) }  \
        else { FM_SWITCH_NA(body, n, (const uint8_t *)w, row_bytes, 2, acts) }          \
    }
_Static_assert(FM_DOTR_MAX == 2, "FM_DEFINE_DOTR instantiates 1 and 2 rows");

// Q6_Kp (row layout, ACT_A8_256P activations)
float fm_dot_q6_Kp_a8_generic(int n, const void *w, const void *a);
float fm_dot_q6_Kp_a8_ssse3(int n, const void *w, const void *a);
float fm_dot_q6_Kp_a8_avx2(int n, const void *w, const void *a);
float fm_dot_q6_Kp_a8_avx512(int n, const void *w, const void *a);
void fm_dotn_q6_Kp_a8_avx2(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotn_q6_Kp_a8_avx512(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotr_q6_Kp_a8_avx512(int n, const void *w, size_t row_bytes, int nr, const void *const *acts, int na, float *out);

// Q4_0p and Q4_Kp (row layouts, ACT_A8_32P and ACT_A8_256K activations): SSSE3 reads them faster
// than the GGUF layouts; the other ISAs read the x8 layouts
float fm_dot_q4_0p_a8_generic(int n, const void *w, const void *a);
float fm_dot_q4_0p_a8_ssse3(int n, const void *w, const void *a);
float fm_dot_q4_Kp_a8_generic(int n, const void *w, const void *a);
float fm_dot_q4_Kp_a8_ssse3(int n, const void *w, const void *a);

// one group of FM_GROUP repacked rows . na <= FM_DOTN_MAX activation rows: out[i * FM_GROUP + r]
typedef void (*fm_vec_dot_g_fn)(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotg_q4_0x8_generic(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotg_q4_0x8_avx2(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotg_q4_Kx8_generic(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotg_q4_Kx8_avx2(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotg_q4_0x8_avx512(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotg_q4_Kx8_avx512(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotg_q4_0x8_ssse3(int n, const void *w, const void *const *acts, int na, float *out);
void fm_dotg_q4_Kx8_ssse3(int n, const void *w, const void *const *acts, int na, float *out);

// IQ2_XXS, IQ2_XS, IQ2_S (iq2_*.c)
#define FM_DECLARE_IQ2_DOTS(isa) \
    float fm_dot_iq2_xxs_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_iq2_xs_a8_##isa(int n, const void *w, const void *a); \
    float fm_dot_iq2_s_a8_##isa(int n, const void *w, const void *a);
#define FM_DECLARE_IQ2_DOTN(isa) \
    void fm_dotn_iq2_xxs_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_iq2_xs_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out); \
    void fm_dotn_iq2_s_a8_##isa(int n, const void *w, const void *const *acts, int na, float *out);
FM_DECLARE_IQ2_DOTS(generic)
FM_DECLARE_IQ2_DOTS(ssse3)
FM_DECLARE_IQ2_DOTS(avx2)
FM_DECLARE_IQ2_DOTS(avx512)
FM_DECLARE_IQ2_DOTN(avx2)
FM_DECLARE_IQ2_DOTN(avx512)
void fm_deq_iq2_xxs(const void *w, float *y, int n);   // n values of a row, for the embedding
void fm_deq_iq2_xs(const void *w, float *y, int n);
void fm_deq_iq2_s(const void *w, float *y, int n);

FM_DECLARE_FLOAT_DOTS(generic)   // float activations; the SSSE3 row uses the F16 one
float fm_dot_f32_ssse3(int n, const void *w, const void *a);
float fm_dot_bf16_ssse3(int n, const void *w, const void *a);
FM_DECLARE_FLOAT_DOTS(avx2)      // the AVX-512 row uses these (F16C is there)

#endif
