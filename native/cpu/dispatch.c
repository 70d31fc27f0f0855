/* ISA dispatch: one `static const` row of kernels per ISA, chosen once by CPUID + XGETBV
 * (the OS must save the wide registers), or forced by fm_isa_select. Also the per-type traits. */
#include <cpuid.h>
#include <stddef.h>
#include "quants.h"
#include "fermium_cpu.h"
#include "internal.h"
#include "ops.h"

// AVX512VBMI: AVX-512 with VBMI, whose byte permutes look the IQ3 grids up from registers
enum { ISA_GENERIC, ISA_SSSE3, ISA_AVX2, ISA_AVX512, ISA_AVX512VBMI, ISA_COUNT };

typedef struct {
    const char *name;
    fm_vec_dot_fn dot[KIND_COUNT];     // indexed by fm_kind
    fm_vec_dot_n_fn dotn[KIND_COUNT];  // batched rows; NULL: the driver loops dot
    fm_vec_dot_g_fn dotg[KIND_COUNT];  // groups of repacked rows; NULL for the GGUF layouts
    fm_vec_dot_r_fn dotr[KIND_COUNT];  // several rows of a row layout at once; NULL: row by row
    fm_gdn_fn gdn;                     // the Gated DeltaNet head update
    fm_conv_fn conv;                   // its conv update
    fm_attn_fn attn;                   // the causal attention of a prefill chunk or decode step
} isa_row;

// fisa: the F32 and BF16 dots; hisa: the F16 dot (fast only with F16C); pisa: the Q4_0p and
// Q4_Kp dots (SSSE3's layouts); gisa: the kernels of the repacked group layouts; disa: the fp32
// DeltaNet and conv update; aisa: the attention; qisa: the IQ3 dots
#define ROW(name, isa, fisa, hisa, pisa, gisa, disa, aisa, qisa, batched, rows) { name, { fm_dot_q4_0_a8_##isa, \
    fm_dot_q8_0_a8_##isa, fm_dot_q4_K_a8_##isa, fm_dot_q5_K_a8_##isa, fm_dot_q6_K_a8_##isa, fm_dot_f32_##fisa, \
    fm_dot_f16_##hisa, fm_dot_bf16_##fisa, [KIND_Q6_KP] = fm_dot_q6_Kp_a8_##isa, \
    [KIND_Q4_0P] = fm_dot_q4_0p_a8_##pisa, [KIND_Q4_KP] = fm_dot_q4_Kp_a8_##pisa, DOTS_IQ2(isa), DOTS_Q32(isa), \
    DOTS_LOWBIT(isa), DOTS_IQ_LOWBIT(isa, qisa) }, batched, \
    { [KIND_Q4_0X8] = fm_dotg_q4_0x8_##gisa, [KIND_Q4_KX8] = fm_dotg_q4_Kx8_##gisa }, rows, fm_gdn_head_##disa, \
    fm_conv_update_##disa, fm_attn_tiled_##aisa }
// the 2-bit i-quants (iq2_*.c)
#define DOTS_IQ2(isa) [KIND_IQ2_XXS] = fm_dot_iq2_xxs_a8_##isa, [KIND_IQ2_XS] = fm_dot_iq2_xs_a8_##isa, \
    [KIND_IQ2_S] = fm_dot_iq2_s_a8_##isa
#define DOTN_IQ2(isa) [KIND_IQ2_XXS] = fm_dotn_iq2_xxs_a8_##isa, [KIND_IQ2_XS] = fm_dotn_iq2_xs_a8_##isa, \
    [KIND_IQ2_S] = fm_dotn_iq2_s_a8_##isa
// the other 32-value block types (q32_*.c)
#define DOTS_Q32(isa) [KIND_Q4_1] = fm_dot_q4_1_a8_##isa, [KIND_Q5_0] = fm_dot_q5_0_a8_##isa, \
    [KIND_Q5_1] = fm_dot_q5_1_a8_##isa, [KIND_IQ4_NL] = fm_dot_iq4_nl_a8_##isa, [KIND_MXFP4] = fm_dot_mxfp4_a8_##isa
#define DOTN_Q32(isa) [KIND_Q4_1] = fm_dotn_q4_1_a8_##isa, [KIND_Q5_0] = fm_dotn_q5_0_a8_##isa, \
    [KIND_Q5_1] = fm_dotn_q5_1_a8_##isa, [KIND_IQ4_NL] = fm_dotn_iq4_nl_a8_##isa, [KIND_MXFP4] = fm_dotn_mxfp4_a8_##isa
// the 2- and 3-bit K-quants, IQ4_XS and the ternary types (lowbit_*.c)
#define DOTS_LOWBIT(isa) [KIND_Q2_K] = fm_dot_q2_K_a8_##isa, [KIND_Q3_K] = fm_dot_q3_K_a8_##isa, \
    [KIND_IQ4_XS] = fm_dot_iq4_xs_a8_##isa, [KIND_TQ2_0] = fm_dot_tq2_0_a8_##isa, [KIND_TQ1_0] = fm_dot_tq1_0_a8_##isa
#define DOTN_LOWBIT(isa) [KIND_Q2_K] = fm_dotn_q2_K_a8_##isa, [KIND_Q3_K] = fm_dotn_q3_K_a8_##isa, \
    [KIND_IQ4_XS] = fm_dotn_iq4_xs_a8_##isa, [KIND_TQ2_0] = fm_dotn_tq2_0_a8_##isa, [KIND_TQ1_0] = fm_dotn_tq1_0_a8_##isa
// the 3- and 1-bit i-quants (iq_lowbit_*.c, iq3_row_generic.c, iq1_row_generic.c)
#define DOTS_IQ_LOWBIT(isa, qisa) [KIND_IQ3_XXS] = fm_dot_iq3_xxs_a8_##qisa, [KIND_IQ3_S] = fm_dot_iq3_s_a8_##qisa, \
    [KIND_IQ1_S] = fm_dot_iq1_s_a8_##isa, [KIND_IQ1_M] = fm_dot_iq1_m_a8_##isa
#define DOTN_IQ_LOWBIT(isa, qisa) [KIND_IQ3_XXS] = fm_dotn_iq3_xxs_a8_##qisa, [KIND_IQ3_S] = fm_dotn_iq3_s_a8_##qisa, \
    [KIND_IQ1_S] = fm_dotn_iq1_s_a8_##isa, [KIND_IQ1_M] = fm_dotn_iq1_m_a8_##isa
#define NO_DOTN { 0 }
#define NO_DOTR { 0 }
#define DOTN_FLOAT_AVX2 [KIND_F32] = fm_dotn_f32_avx2, [KIND_F16] = fm_dotn_f16_avx2, [KIND_BF16] = fm_dotn_bf16_avx2
#define DOTN_AVX2 { [KIND_Q4_0] = fm_dotn_q4_0_a8_avx2, [KIND_Q4_K] = fm_dotn_q4_K_a8_avx2, \
                    [KIND_Q6_K] = fm_dotn_q6_K_a8_avx2, [KIND_Q6_KP] = fm_dotn_q6_Kp_a8_avx2, DOTN_FLOAT_AVX2, \
                    DOTN_IQ2(avx2), DOTN_Q32(avx2), DOTN_LOWBIT(avx2), DOTN_IQ_LOWBIT(avx2, avx2) }
#define DOTN_AVX512(qisa) { [KIND_Q4_0] = fm_dotn_q4_0_a8_avx512, [KIND_Q4_K] = fm_dotn_q4_K_a8_avx512, \
                      [KIND_Q6_K] = fm_dotn_q6_K_a8_avx512, [KIND_Q6_KP] = fm_dotn_q6_Kp_a8_avx512, DOTN_FLOAT_AVX2, \
                      DOTN_IQ2(avx512), DOTN_Q32(avx512), DOTN_LOWBIT(avx512), DOTN_IQ_LOWBIT(avx512, qisa) }

static const isa_row ISA_ROWS[ISA_COUNT] = {
    ROW("generic", generic, generic, generic, generic, generic, generic, generic, generic, NO_DOTN, NO_DOTR),
    ROW("ssse3", ssse3, ssse3, generic, ssse3, ssse3, ssse3, ssse3, ssse3, NO_DOTN, NO_DOTR),
    ROW("avx2", avx2, avx2, avx2, generic, avx2, avx2, avx2, avx2, DOTN_AVX2, NO_DOTR),
    ROW("avx512", avx512, avx2, avx2, generic, avx512, avx2, avx512, avx512, DOTN_AVX512(avx512),
        { [KIND_Q6_KP] = fm_dotr_q6_Kp_a8_avx512 }),
    ROW("avx512vbmi", avx512, avx2, avx2, generic, avx512, avx2, avx512, avx512vbmi, DOTN_AVX512(avx512vbmi),
        { [KIND_Q6_KP] = fm_dotr_q6_Kp_a8_avx512 }),
};

// GGML type -> traits; activation kind decides how x is quantized before the dot
const fm_type_traits FM_TYPES[KIND_COUNT] = {
    [KIND_Q4_0] = { FM_Q4_0, QK32, sizeof(block_q4_0), ACT_A8_32, 1 },
    [KIND_Q8_0] = { FM_Q8_0, QK32, sizeof(block_q8_0), ACT_A8_32, 1 },
    [KIND_Q4_K] = { FM_Q4_K, QK_K, sizeof(block_q4_K), ACT_A8_256, 1 },
    [KIND_Q5_K] = { FM_Q5_K, QK_K, sizeof(block_q5_K), ACT_A8_256, 1 },
    [KIND_Q6_K] = { FM_Q6_K, QK_K, sizeof(block_q6_K), ACT_A8_256, 1 },
    [KIND_F32] = { FM_F32, 1, 4, ACT_F32, 1 },
    [KIND_F16] = { FM_F16, 1, 2, ACT_F32, 1 },
    [KIND_BF16] = { FM_BF16, 1, 2, ACT_F32, 1 },
    [KIND_Q4_0X8] = { FM_Q4_0X8, QK32, sizeof(block_q4_0), ACT_A8_32, FM_GROUP },   // bytes per row and block
    [KIND_Q4_KX8] = { FM_Q4_KX8, QK_K, sizeof(block_q4_K), ACT_A8_256, FM_GROUP },
    [KIND_Q6_KP] = { FM_Q6_KP, QK_K, sizeof(block_q6_Kp), ACT_A8_256P, 1 },
    [KIND_Q4_0P] = { FM_Q4_0P, QK_Q4_0P, sizeof(block_q4_0p), ACT_A8_32P, 1 },
    [KIND_Q4_KP] = { FM_Q4_KP, QK_K, sizeof(block_q4_K), ACT_A8_256K, 1 },
    [KIND_IQ2_XXS] = { FM_IQ2_XXS, QK_K, sizeof(block_iq2_xxs), ACT_A8_256, 1 },
    [KIND_IQ2_XS] = { FM_IQ2_XS, QK_K, sizeof(block_iq2_xs), ACT_A8_256, 1 },
    [KIND_IQ2_S] = { FM_IQ2_S, QK_K, sizeof(block_iq2_s), ACT_A8_256, 1 },
    [KIND_Q4_1] = { FM_Q4_1, QK32, sizeof(block_q4_1), ACT_A8_32, 1 },
    [KIND_Q5_0] = { FM_Q5_0, QK32, sizeof(block_q5_0), ACT_A8_32, 1 },
    [KIND_Q5_1] = { FM_Q5_1, QK32, sizeof(block_q5_1), ACT_A8_32, 1 },
    [KIND_IQ4_NL] = { FM_IQ4_NL, QK32, sizeof(block_iq4_nl), ACT_A8_32, 1 },
    [KIND_MXFP4] = { FM_MXFP4, QK32, sizeof(block_mxfp4), ACT_A8_32, 1 },
    [KIND_Q2_K] = { FM_Q2_K, QK_K, sizeof(block_q2_K), ACT_A8_256, 1 },
    [KIND_Q3_K] = { FM_Q3_K, QK_K, sizeof(block_q3_K), ACT_A8_256, 1 },
    [KIND_IQ4_XS] = { FM_IQ4_XS, QK_K, sizeof(block_iq4_xs), ACT_A8_256, 1 },
    [KIND_TQ2_0] = { FM_TQ2_0, QK_K, sizeof(block_tq2_0), ACT_A8_256, 1 },
    [KIND_TQ1_0] = { FM_TQ1_0, QK_K, sizeof(block_tq1_0), ACT_A8_256, 1 },
    [KIND_IQ3_XXS] = { FM_IQ3_XXS, QK_K, sizeof(block_iq3_xxs), ACT_A8_256, 1 },
    [KIND_IQ3_S] = { FM_IQ3_S, QK_K, sizeof(block_iq3_s), ACT_A8_256, 1 },
    [KIND_IQ1_S] = { FM_IQ1_S, QK_K, sizeof(block_iq1_s), ACT_A8_256, 1 },
    [KIND_IQ1_M] = { FM_IQ1_M, QK_K, sizeof(block_iq1_m), ACT_A8_256, 1 },
};

int fm_kind_of(int type) {
    for (int k = 0; k < KIND_COUNT; k++)
        if (FM_TYPES[k].type == type) return k;
    return -1;
}

static const isa_row *active;

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

int fm_isa_supported(int isa) {
    unsigned a, b, c, d;
    if (isa == ISA_GENERIC) return 1;
    if (isa < 0 || isa >= ISA_COUNT || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (isa == ISA_SSSE3) return (c >> 9) & 1;
    const unsigned fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!(osxsave && avx && fma && f16c)) return 0;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return 0;                        // XMM and YMM state saved
    unsigned a7, b7, c7, d7;
    if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) return 0;
    const unsigned avx2 = (b7 >> 5) & 1;
    if (isa == ISA_AVX2) return avx2;
    if ((xcr0 & 0xE6) != 0xE6) return 0;                      // opmask and ZMM state saved
    const unsigned f = (b7 >> 16) & 1, bw = (b7 >> 30) & 1, vl = (b7 >> 31) & 1, vnni = (c7 >> 11) & 1;
    const unsigned vbmi = (c7 >> 1) & 1;
    return avx2 && f && bw && vl && vnni && (isa == ISA_AVX512 || vbmi);
}

int fm_isa_best(void) {
    for (int isa = ISA_COUNT - 1; isa > 0; isa--)
        if (fm_isa_supported(isa)) return isa;
    return ISA_GENERIC;
}

int fm_isa_select(int isa) {
    if (!fm_isa_supported(isa)) return -1;
    active = &ISA_ROWS[isa];
    return 0;
}

int fm_isa_active(void) {
    if (!active) fm_isa_select(fm_isa_best());
    return (int)(active - ISA_ROWS);
}

const char *fm_isa_name(int isa) {
    return isa >= 0 && isa < ISA_COUNT ? ISA_ROWS[isa].name : "unknown";
}

fm_vec_dot_fn fm_dot_for(int isa, int kind) {
    if (isa < 0) isa = fm_isa_active();
    return ISA_ROWS[isa].dot[kind];
}

fm_vec_dot_n_fn fm_dotn_for(int isa, int kind) {
    if (isa < 0) isa = fm_isa_active();
    return ISA_ROWS[isa].dotn[kind];
}

fm_vec_dot_g_fn fm_dotg_for(int isa, int kind) {
    if (isa < 0) isa = fm_isa_active();
    return ISA_ROWS[isa].dotg[kind];
}

fm_vec_dot_r_fn fm_dotr_for(int isa, int kind) {
    if (isa < 0) isa = fm_isa_active();
    return ISA_ROWS[isa].dotr[kind];
}

void fm_gdn_head(FM_GDN_ARGS) {
    if (!active) fm_isa_active();
    active->gdn(S0, S, q, k, v, decay, beta, o, dk, dv, stream);
}

void fm_conv_update(FM_CONV_ARGS) {
    if (!active) fm_isa_active();
    active->conv(state, w, x, out, C, K);
}

void fm_attn_tiled(FM_ATTN_ARGS) {
    if (!active) fm_isa_active();
    active->attn(FM_ATTN_PASS);
}

fm_attn_fn fm_attn_for(int isa) {
    if (isa < 0) isa = fm_isa_active();
    return fm_isa_supported(isa) ? ISA_ROWS[isa].attn : NULL;
}

int fm_attn_tiled_isa(int isa, FM_ATTN_ARGS) {
    if (!fm_isa_supported(isa)) return -1;
    ISA_ROWS[isa].attn(FM_ATTN_PASS);
    return 0;
}

int fm_conv_update_isa(int isa, float *state, const float *w, const float *x, float *out, int C, int K) {
    if (!fm_isa_supported(isa)) return -1;
    ISA_ROWS[isa].conv(state, w, x, out, C, K);
    return 0;
}

int fm_gdn_head_isa(int isa, float *S, const float *q, const float *k, const float *v, float decay, float beta,
                    float *o, int dk, int dv) {
    return fm_gdn_head_to_isa(isa, S, S, q, k, v, decay, beta, o, dk, dv, 0);
}

int fm_gdn_head_to_isa(int isa, const float *S0, float *S, const float *q, const float *k, const float *v,
                       float decay, float beta, float *o, int dk, int dv, int stream) {
    if (!fm_isa_supported(isa)) return -1;
    ISA_ROWS[isa].gdn(S0, S, q, k, v, decay, beta, o, dk, dv, stream);
    return 0;
}

float fm_vec_dot(int isa, int type, int n, const void *w, const void *act) {
    return fm_dot_for(isa, fm_kind_of(type))(n, w, act);
}

int fm_vec_dot_group(int isa, int type, int n, const void *w, const void *const *acts, int na, float *out) {
    const int kind = fm_kind_of(type);
    if (kind < 0 || FM_TYPES[kind].group == 1 || na < 1 || na > FM_DOTN_MAX) return -1;
    fm_dotg_for(isa, kind)(n, w, acts, na, out);
    return 0;
}

int fm_has_dot_rows(int isa, int type) {
    const int kind = fm_kind_of(type);
    return fm_isa_supported(isa) && kind >= 0 && fm_dotr_for(isa, kind) != NULL;
}

int fm_vec_dot_rows(int isa, int type, int n, const void *w, size_t row_bytes, int nr, const void *const *acts,
                    int na, float *out) {
    const int kind = fm_kind_of(type);
    if (!fm_has_dot_rows(isa, type) || nr < 1 || nr > FM_DOTR_MAX || na < 1 || na > FM_DOTN_MAX) return -1;
    fm_dotr_for(isa, kind)(n, w, row_bytes, nr, acts, na, out);
    return 0;
}

int fm_type_supported(int type) { return fm_kind_of(type) >= 0; }
int fm_type_block(int type) { return FM_TYPES[fm_kind_of(type)].block; }
int fm_type_block_bytes(int type) { return FM_TYPES[fm_kind_of(type)].block_bytes; }
int fm_type_group(int type) { return FM_TYPES[fm_kind_of(type)].group; }
