/* Standalone check of the native/cpu kernels, without Python: every ISA this CPU runs
 * against the generic sibling on random blocks, then a cache-resident speed figure per kernel;
 * and each ISA's attention over each KV cache type against the generic one (attn_check.h).
 * Not part of the extension. Build from the repository root:
 *
 *   cc -O2 -Inative/cpu native/cpu/selftest/selftest.c native/cpu/{dispatch,quantize,repack,ops}.c \
 *      native/cpu/*_generic.c build/native_cpu_isa/*.o -lm -o /tmp/fm_selftest
 *
 * (build/native_cpu_isa holds the per-ISA objects that `pip install -e .` compiled.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>
#include "fermium_cpu.h"
#include "quants.h"
#include "internal.h"
#include "random_blocks.h"
#include "attn_check.h"

#define COLS 2048
#define ROWS 128
#define SIBLING_RTOL 1e-5   // same integer sums, different float accumulation order

static const int TYPES[] = { FM_Q4_0, FM_Q8_0, FM_Q4_K, FM_Q5_K, FM_Q6_K, FM_F32, FM_F16, FM_BF16,
                             FM_IQ2_XXS, FM_IQ2_XS, FM_IQ2_S, FM_Q4_1, FM_Q5_0, FM_Q5_1, FM_IQ4_NL, FM_MXFP4 };
static const char *TYPE_NAMES[] = { "Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F32", "F16", "BF16",
                                    "IQ2_XXS", "IQ2_XS", "IQ2_S", "Q4_1", "Q5_0", "Q5_1", "IQ4NL", "MXFP4" };

// the largest difference, relative to the dot, between the generic kernel of `ref_type` on rows
// `ref_w` and ISA `isa`'s kernel of `type` on rows `w` (the same rows, maybe repacked)
static double worst_rel(int isa, int ref_type, const uint8_t *ref_w, const void *ref_act, int type,
                        const uint8_t *w, const void *act, size_t row_bytes) {
    double worst = 0.0;
    for (int r = 0; r < ROWS; r++) {
        const float g = fm_vec_dot(0, ref_type, COLS, ref_w + r * row_bytes, ref_act);
        const float s = fm_vec_dot(isa, type, COLS, w + r * row_bytes, act);
        const double rel = fabs((double)s - g) / (fabs(g) + 1e-3);
        worst = rel > worst ? rel : worst;
    }
    return worst;
}

// a GGUF type repacked row by row for 128-bit registers (Q4_0p, Q4_Kp), every ISA: against the
// generic GGUF-layout kernel on the same rows, and its speed next to the GGUF layout's
static int check_row_repack(const char *name, int packed_type, const float *x) {
    const int source = fm_repack_source(packed_type);
    const size_t row_bytes = (size_t)COLS / fm_type_block(source) * fm_type_block_bytes(source);
    uint8_t *w = malloc(row_bytes * ROWS), *packed = malloc(row_bytes * ROWS);
    uint8_t *act = malloc(fm_act_bytes(source, COLS)), *pact = malloc(fm_act_bytes(packed_type, COLS));
    int failures = 0;
    fill_blocks(source, w, row_bytes * ROWS);
    fm_repack(packed_type, w, ROWS, COLS, packed);
    fm_quantize_act(source, x, COLS, act);
    fm_quantize_act(packed_type, x, COLS, pact);
    printf("%-6s", name);
    for (int isa = 0; isa < 4; isa++) {
        if (!fm_isa_supported(isa)) continue;
        const double worst = worst_rel(isa, source, w, act, packed_type, packed, pact, row_bytes);
        double ticks[2] = { 1e30, 1e30 };
        volatile float sink = 0.0f;
        for (int rep = 0; rep < 50; rep++)
            for (int k = 0; k < 2; k++) {   // GGUF layout, then repacked
                const unsigned long long t0 = __rdtsc();
                for (int r = 0; r < ROWS; r++)
                    sink += k ? fm_vec_dot(isa, packed_type, COLS, packed + r * row_bytes, pact)
                              : fm_vec_dot(isa, source, COLS, w + r * row_bytes, act);
                const double d = (double)(__rdtsc() - t0);
                ticks[k] = d < ticks[k] ? d : ticks[k];
            }
        const int ok = worst <= SIBLING_RTOL * 100;
        failures += !ok;
        printf("  %s %s %.1e %.2f (GGUF %.2f) B/tick", fm_isa_name(isa), ok ? "ok" : "FAIL", worst,
               (double)row_bytes * ROWS / ticks[1], (double)row_bytes * ROWS / ticks[0]);
    }
    printf("\n");
    free(w);
    free(packed);
    free(act);
    free(pact);
    return failures;
}

int main(void) {
    int failures = 0;
    const double tsc_hz = 0;  // ratios only: cycles are TSC ticks
    (void)tsc_hz;
    float x[COLS];
    for (int i = 0; i < COLS; i++) x[i] = ((int)(next() % 2001) - 1000) / 500.0f;
    printf("best ISA here: %s\n", fm_isa_name(fm_isa_best()));
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
        const int type = TYPES[t];
        const size_t row_bytes = (size_t)COLS / fm_type_block(type) * fm_type_block_bytes(type);
        uint8_t *w = malloc(row_bytes * ROWS), *act = malloc(fm_act_bytes(type, COLS));
        fill_blocks(type, w, row_bytes * ROWS);
        fm_quantize_act(type, x, COLS, act);
        printf("%-7s", TYPE_NAMES[t]);
        for (int isa = 0; isa < 4; isa++) {
            if (!fm_isa_supported(isa)) continue;
            const double worst = worst_rel(isa, type, w, act, type, w, act, row_bytes);
            volatile float sink = 0.0f;
            double best = 1e30;
            for (int rep = 0; rep < 50; rep++) {
                const unsigned long long t0 = __rdtsc();
                for (int r = 0; r < ROWS; r++) sink += fm_vec_dot(isa, type, COLS, w + r * row_bytes, act);
                const double ticks = (double)(__rdtsc() - t0);
                best = ticks < best ? ticks : best;
            }
            const int ok = worst <= SIBLING_RTOL * 100;   // relative to |dot|, which can be small
            failures += !ok;
            printf("  %s %s %.1e %.2f B/tick", fm_isa_name(isa), ok ? "ok" : "FAIL", worst,
                   (double)row_bytes * ROWS / best);
        }
        printf("\n");
        free(w);
        free(act);
    }
    // batched kernels: one row against FM_DOTN_MAX activations, weight bytes per tick
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
        const int type = TYPES[t], kind = fm_kind_of(type);
        const fm_vec_dot_n_fn dotn = fm_dotn_for(fm_isa_best(), kind);
        if (!dotn) continue;
        const size_t row_bytes = (size_t)COLS / fm_type_block(type) * fm_type_block_bytes(type);
        uint8_t *w = malloc(row_bytes * ROWS), *act = malloc(fm_act_bytes(type, COLS) * FM_DOTN_MAX);
        const void *acts[FM_DOTN_MAX];
        fill_blocks(type, w, row_bytes * ROWS);
        for (int i = 0; i < FM_DOTN_MAX; i++) {
            acts[i] = act + fm_act_bytes(type, COLS) * i;
            fm_quantize_act(type, x, COLS, act + fm_act_bytes(type, COLS) * i);
        }
        float y[FM_DOTN_MAX];
        double worst = 0.0;   // against the row kernel of the same ISA, activation by activation
        for (int r = 0; r < ROWS; r++) {
            dotn(COLS, w + r * row_bytes, acts, FM_DOTN_MAX, y);
            for (int i = 0; i < FM_DOTN_MAX; i++) {
                const float g = fm_vec_dot(fm_isa_best(), type, COLS, w + r * row_bytes, acts[i]);
                const double rel = fabs((double)y[i] - g) / (fabs(g) + 1e-3);
                worst = rel > worst ? rel : worst;
            }
        }
        failures += worst > SIBLING_RTOL * 100;
        volatile float sink = 0.0f;
        double best = 1e30;
        for (int rep = 0; rep < 50; rep++) {
            const unsigned long long t0 = __rdtsc();
            for (int r = 0; r < ROWS; r++) { dotn(COLS, w + r * row_bytes, acts, FM_DOTN_MAX, y); sink += y[0]; }
            const double ticks = (double)(__rdtsc() - t0);
            best = ticks < best ? ticks : best;
        }
        printf("%-5s %s x%d activations: %s %.1e %.2f weight B/tick\n", TYPE_NAMES[t], fm_isa_name(fm_isa_best()),
               FM_DOTN_MAX, worst <= SIBLING_RTOL * 100 ? "ok" : "FAIL", worst, (double)row_bytes * ROWS / best);
        free(w);
        free(act);
    }
    // repacked groups of 8 rows, every ISA: against the generic row kernel, and the speed of one
    // and of FM_DOTN_MAX activations next to the GGUF-layout kernels of the same ISA
    static const struct { int packed; const char *name; } GROUPED[] = { { FM_Q4_0X8, "Q4_0" }, { FM_Q4_KX8, "Q4_K" } };
    for (size_t t = 0; t < sizeof GROUPED / sizeof GROUPED[0]; t++) {
        const int type = fm_repack_source(GROUPED[t].packed);
        const size_t row_bytes = (size_t)COLS / fm_type_block(type) * fm_type_block_bytes(type);
        uint8_t *w = malloc(row_bytes * ROWS), *packed = malloc(row_bytes * ROWS), *act = malloc(fm_act_bytes(type, COLS) * FM_DOTN_MAX);
        const void *acts[FM_DOTN_MAX];
        fill_blocks(type, w, row_bytes * ROWS);
        fm_repack(GROUPED[t].packed, w, ROWS, COLS, packed);
        for (int i = 0; i < FM_DOTN_MAX; i++) {
            acts[i] = act + fm_act_bytes(type, COLS) * i;
            fm_quantize_act(type, x, COLS, act + fm_act_bytes(type, COLS) * i);
        }
        printf("%-5s x8", GROUPED[t].name);
        for (int isa = 0; isa < 4; isa++) {
            if (!fm_isa_supported(isa)) continue;
            const fm_vec_dot_g_fn dotg = fm_dotg_for(isa, fm_kind_of(GROUPED[t].packed));
            const fm_vec_dot_n_fn dotn = fm_dotn_for(isa, fm_kind_of(type));
            float y[FM_DOTN_MAX * FM_GROUP];
            double worst = 0.0;
            for (int g = 0; g < ROWS / FM_GROUP; g++) {
                dotg(COLS, packed + g * FM_GROUP * row_bytes, acts, FM_DOTN_MAX, y);
                for (int i = 0; i < FM_DOTN_MAX; i++)
                    for (int r = 0; r < FM_GROUP; r++) {
                        const float ref = fm_vec_dot(0, type, COLS, w + (g * FM_GROUP + r) * row_bytes, acts[i]);
                        const double rel = fabs((double)y[FM_GROUP * i + r] - ref) / (fabs(ref) + 1e-3);
                        worst = rel > worst ? rel : worst;
                    }
            }
            const int ok = worst <= SIBLING_RTOL * 100;
            failures += !ok;
            double ticks[4] = { 1e30, 1e30, 1e30, 1e30 };   // rows x1, groups x1, rows xN, groups xN
            volatile float sink = 0.0f;
            for (int rep = 0; rep < 50; rep++) {
                unsigned long long t0 = __rdtsc();
                for (int r = 0; r < ROWS; r++) sink += fm_vec_dot(isa, type, COLS, w + r * row_bytes, acts[0]);
                unsigned long long t1 = __rdtsc();
                for (int g = 0; g < ROWS / FM_GROUP; g++) { dotg(COLS, packed + g * FM_GROUP * row_bytes, acts, 1, y); sink += y[0]; }
                unsigned long long t2 = __rdtsc();
                for (int r = 0; r < ROWS; r++) {
                    if (dotn) dotn(COLS, w + r * row_bytes, acts, FM_DOTN_MAX, y);
                    else for (int i = 0; i < FM_DOTN_MAX; i++) y[i] = fm_vec_dot(isa, type, COLS, w + r * row_bytes, acts[i]);
                    sink += y[0];
                }
                unsigned long long t3 = __rdtsc();
                for (int g = 0; g < ROWS / FM_GROUP; g++) { dotg(COLS, packed + g * FM_GROUP * row_bytes, acts, FM_DOTN_MAX, y); sink += y[0]; }
                const unsigned long long t4 = __rdtsc(), d[4] = { t1 - t0, t2 - t1, t3 - t2, t4 - t3 };
                for (int k = 0; k < 4; k++) ticks[k] = d[k] < ticks[k] ? d[k] : ticks[k];
            }
            const double bytes = (double)row_bytes * ROWS;
            printf("  %s %s %.1e x1 %.2f (rows %.2f) x%d %.2f (rows %.2f) B/tick", fm_isa_name(isa), ok ? "ok" : "FAIL", worst,
                   bytes / ticks[1], bytes / ticks[0], FM_DOTN_MAX, bytes / ticks[3], bytes / ticks[2]);
        }
        printf("\n");
        free(w);
        free(packed);
        free(act);
    }
    // Q6_K repacked row by row (Q6_Kp), every ISA: against the generic Q6_K row kernel on the
    // same rows, and the speed of one and of FM_DOTN_MAX activations next to the GGUF layout
    {
        const size_t row_bytes = (size_t)COLS / QK_K * sizeof(block_q6_K), ab = fm_act_bytes(FM_Q6_K, COLS);
        const size_t pab = fm_act_bytes(FM_Q6_KP, COLS);   // with the offset corrections (quants.h)
        uint8_t *w = malloc(row_bytes * ROWS), *packed = malloc(row_bytes * ROWS);
        uint8_t *act = malloc(ab * FM_DOTN_MAX), *pact = malloc(pab * FM_DOTN_MAX);
        const void *acts[FM_DOTN_MAX], *pacts[FM_DOTN_MAX];
        fill_blocks(FM_Q6_K, w, row_bytes * ROWS);
        fm_repack(FM_Q6_KP, w, ROWS, COLS, packed);
        for (int i = 0; i < FM_DOTN_MAX; i++) {
            for (int c = 0; c < COLS; c++) x[c] = ((int)(next() % 2001) - 1000) / 500.0f;
            acts[i] = act + ab * i;
            pacts[i] = pact + pab * i;
            fm_quantize_act(FM_Q6_K, x, COLS, act + ab * i);
            fm_quantize_act(FM_Q6_KP, x, COLS, pact + pab * i);
        }
        printf("Q6_Kp");
        for (int isa = 0; isa < 4; isa++) {
            if (!fm_isa_supported(isa)) continue;
            const fm_vec_dot_n_fn dotn = fm_dotn_for(isa, fm_kind_of(FM_Q6_K)), dotp = fm_dotn_for(isa, fm_kind_of(FM_Q6_KP));
            float y[FM_DOTN_MAX];
            double worst = 0.0;
            for (int r = 0; r < ROWS; r++)
                for (int i = 0; i < FM_DOTN_MAX; i++) {
                    const float ref = fm_vec_dot(0, FM_Q6_K, COLS, w + r * row_bytes, acts[i]);
                    const float got = fm_vec_dot(isa, FM_Q6_KP, COLS, packed + r * row_bytes, pacts[i]);
                    double rel = fabs((double)got - ref) / (fabs(ref) + 1e-3);
                    if (dotp) {
                        dotp(COLS, packed + r * row_bytes, pacts, FM_DOTN_MAX, y);
                        const double relb = fabs((double)y[i] - ref) / (fabs(ref) + 1e-3);
                        rel = relb > rel ? relb : rel;
                    }
                    worst = rel > worst ? rel : worst;
                }
            const int ok = worst <= SIBLING_RTOL * 100;
            failures += !ok;
            // GGUF x1, Q6_Kp x1, GGUF xN, Q6_Kp xN, Q6_Kp xN through the kernel for several rows
            const fm_vec_dot_r_fn dotr = fm_dotr_for(isa, fm_kind_of(FM_Q6_KP));
            double ticks[5] = { 1e30, 1e30, 1e30, 1e30, 1e30 };
            volatile float sink = 0.0f;
            for (int rep = 0; rep < 50; rep++) {
                unsigned long long t[6];
                for (int k = 0; k < 4; k++) {
                    const uint8_t *base = k % 2 ? packed : w;
                    const int type = k % 2 ? FM_Q6_KP : FM_Q6_K;
                    const void *const *a = k % 2 ? pacts : acts;
                    const fm_vec_dot_n_fn batched = k % 2 ? dotp : dotn;
                    t[k] = __rdtsc();
                    for (int r = 0; r < ROWS; r++) {
                        if (k < 2) { sink += fm_vec_dot(isa, type, COLS, base + r * row_bytes, a[0]); continue; }
                        if (batched) batched(COLS, base + r * row_bytes, a, FM_DOTN_MAX, y);
                        else for (int i = 0; i < FM_DOTN_MAX; i++) y[i] = fm_vec_dot(isa, type, COLS, base + r * row_bytes, a[i]);
                        sink += y[0];
                    }
                }
                t[4] = __rdtsc();
                for (int r = 0; dotr && r < ROWS; r += FM_DOTR_MAX) {
                    float yr[FM_DOTN_MAX * FM_DOTR_MAX];
                    dotr(COLS, packed + r * row_bytes, row_bytes, FM_DOTR_MAX, pacts, FM_DOTN_MAX, yr);
                    sink += yr[0];
                }
                t[5] = __rdtsc();
                for (int k = 0; k < 5; k++) ticks[k] = (double)(t[k + 1] - t[k]) < ticks[k] ? (double)(t[k + 1] - t[k]) : ticks[k];
            }
            const double bytes = (double)row_bytes * ROWS;
            printf("  %s %s %.1e x1 %.2f (Q6_K %.2f) x%d %.2f (Q6_K %.2f) B/tick", fm_isa_name(isa), ok ? "ok" : "FAIL", worst,
                   bytes / ticks[1], bytes / ticks[0], FM_DOTN_MAX, bytes / ticks[3], bytes / ticks[2]);
            if (dotr) printf(" (%d rows at once %.2f)", FM_DOTR_MAX, bytes / ticks[4]);
        }
        printf("\n");
        free(w);
        free(packed);
        free(act);
        free(pact);
    }
    for (int c = 0; c < COLS; c++) x[c] = ((int)(next() % 2001) - 1000) / 500.0f;
    failures += check_row_repack("Q4_0p", FM_Q4_0P, x);
    failures += check_row_repack("Q4_Kp", FM_Q4_KP, x);
    failures += check_attention();
    printf(failures ? "FAILED: %d kernel(s)\n" : "all kernels agree with generic\n", failures);
    return failures != 0;
}
