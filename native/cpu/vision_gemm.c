/* The vision tower's batched matmul (vision.h: fm_vis_gemm) over the pool, its plain-C
 * microkernel and the per-ISA choice of microkernel. Not the decode matvec (matvec.c): that
 * streams each weight row once for a few activation rows; here an image's hundreds to
 * thousands of patches make the weights' reuse, not their bytes, the limit.
 *
 * A task is a tile of RT weight rows x NT patches. For each block of KC columns its weight rows
 * are dequantized once into the thread's panel (f32, NR rows interleaved per column, the layout
 * the microkernels read), then every MR patches of the tile go through the microkernel with
 * every NR rows of the panel. So each weight block is read and converted once per tile of
 * patches, the panel stays in L2 and a microkernel's A rows in L1. The tile's output takes the
 * activation once all its columns are in. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "ops.h"
#include "vision.h"

#define KC 256            // columns per panel: a multiple of Q8_0's 32
#define RT 64             // weight rows per task: whole panels of every ISA's NR
#define NT 384            // patches per task: whole microkernels of every ISA's MR
#define GEN_MR 4
#define GEN_NR 16
_Static_assert(KC % QK32 == 0 && RT % FM_VIS_NR_MAX == 0 && RT % GEN_NR == 0, "tiles of whole blocks");
_Static_assert(NT % FM_VIS_AVX2_MR == 0 && NT % FM_VIS_SSSE3_MR == 0 && NT % GEN_MR == 0, "whole microkernels");

// ---- the plain-C microkernel

void fm_vis_micro_generic(int kc, const float *const *a, const float *panel, float *c, size_t ldc,
                          const float *bias, int load_c) {
    float acc[GEN_MR][GEN_NR];
    for (int i = 0; i < GEN_MR; i++)
        for (int j = 0; j < GEN_NR; j++)
            acc[i][j] = (load_c ? c[(size_t)i * ldc + j] : 0.0f) + (bias ? bias[j] : 0.0f);
    for (int k = 0; k < kc; k++) {
        const float *p = panel + (size_t)k * GEN_NR;
        for (int i = 0; i < GEN_MR; i++) {
            const float x = a[i][k];
            for (int j = 0; j < GEN_NR; j++) acc[i][j] += x * p[j];
        }
    }
    for (int i = 0; i < GEN_MR; i++) memcpy(c + (size_t)i * ldc, acc[i], sizeof(float) * GEN_NR);
}

float fm_vis_softmax_generic(float *s, int n, float scale) {
    float m = -INFINITY, sum = 0.0f;
    for (int j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
    for (int j = 0; j < n; j++) sum += s[j] = fm_expf((s[j] - m) * scale);
    return sum;
}

void fm_vis_gelu_tanh_generic(float *r, int n) {   // 0.5 x (1 + tanh u) = x sigmoid(2u)
    for (int j = 0; j < n; j++) {
        const float x = r[j], u = 0.7978845608f * (x + 0.044715f * x * x * x);
        r[j] = x / (1.0f + fm_expf(-2.0f * u));
    }
}

// by ISA id (dispatch.c's order)
#define KERNEL(isa, mr, nr) { fm_vis_micro_##isa, fm_vis_softmax_##isa, fm_vis_gelu_tanh_##isa, mr, nr }
static const fm_vis_kernel KERNELS[] = {
    KERNEL(generic, GEN_MR, GEN_NR),
    KERNEL(ssse3, FM_VIS_SSSE3_MR, FM_VIS_SSSE3_NR),
    KERNEL(avx2, FM_VIS_AVX2_MR, FM_VIS_AVX2_NR),
    KERNEL(avx512, FM_VIS_AVX512_MR, FM_VIS_AVX512_NR),
    KERNEL(avx512, FM_VIS_AVX512_MR, FM_VIS_AVX512_NR),   // AVX-512 with VBMI
};

const fm_vis_kernel *fm_vis_kernel_active(void) { return &KERNELS[fm_isa_active()]; }

// ---- weights to panels

// values k0..k0+kc of one weight row to floats
static void row_f32(int type, const uint8_t *row, int k0, int kc, float *out) {
    switch (type) {
    case FM_F32:
        memcpy(out, (const float *)row + k0, sizeof(float) * (size_t)kc);
        break;
    case FM_F16:
        for (int k = 0; k < kc; k++) out[k] = fm_half(((const fm_f16 *)row)[k0 + k]);
        break;
    case FM_BF16:
        for (int k = 0; k < kc; k++) {
            const uint32_t bits = (uint32_t)((const uint16_t *)row)[k0 + k] << 16;
            memcpy(out + k, &bits, 4);
        }
        break;
    default: {   // FM_Q8_0: k0 and kc are whole blocks
        const block_q8_0 *b = (const block_q8_0 *)row + k0 / QK32;
        for (int i = 0; i < kc / QK32; i++) {
            const float d = fm_half(b[i].d);
            for (int j = 0; j < QK32; j++) out[i * QK32 + j] = d * (float)b[i].qs[j];
        }
    }
    }
}

// rows r0..r1 of W, columns k0..k0+kc -> panel[sub][k][nr] for the subpanels of nr rows that
// cover RT rows; rows past r1 are zero
static void pack(int type, const uint8_t *w, size_t row_bytes, int r0, int r1, int k0, int kc, int nr,
                 float *panel, float *row) {
    for (int s = 0; s < RT / nr; s++) {
        float *sub = panel + (size_t)s * kc * nr;
        for (int j = 0; j < nr; j++) {
            const int r = r0 + s * nr + j;
            if (r >= r1) {
                for (int k = 0; k < kc; k++) sub[(size_t)k * nr + j] = 0.0f;
                continue;
            }
            row_f32(type, w + (size_t)r * row_bytes, k0, kc, row);
            for (int k = 0; k < kc; k++) sub[(size_t)k * nr + j] = row[k];
        }
    }
}

// ---- the activations of the tile's output

static void activate(const fm_vis_kernel *kern, int act, float *y, size_t ldy, int rows, int cols) {
    for (int i = 0; i < rows; i++) {
        float *r = y + (size_t)i * ldy;
        if (act == 1) kern->gelu_tanh(r, cols);
        else for (int j = 0; j < cols; j++) r[j] = 0.5f * r[j] * (1.0f + erff(r[j] * 0.70710678f));   // GELU erf
    }
}

// ---- the driver

typedef struct {
    fm_vis_kernel kern;
    int type, rows, cols, n, accumulate, act, row_tiles;
    const uint8_t *w;
    size_t row_bytes, ldx, ldy, scratch;   // scratch: floats per thread
    const float *x, *bias;                 // bias padded to whole panels, or NULL
    float *y, *work;
} gemm_ctx;

static void gemm_task(void *arg, int task, int thread) {
    const gemm_ctx *g = arg;
    const int mr = g->kern.mr, nr = g->kern.nr;
    const int r0 = task % g->row_tiles * RT, p0 = task / g->row_tiles * NT;
    const int r1 = r0 + RT < g->rows ? r0 + RT : g->rows, p1 = p0 + NT < g->n ? p0 + NT : g->n;
    float *panel = g->work + (size_t)thread * g->scratch, *row = panel + (size_t)RT * KC;
    float tmp[FM_VIS_MR_MAX * FM_VIS_NR_MAX];
    for (int k0 = 0; k0 < g->cols; k0 += KC) {
        const int kc = g->cols - k0 < KC ? g->cols - k0 : KC;
        pack(g->type, g->w, g->row_bytes, r0, r1, k0, kc, nr, panel, row);
        const int load_c = k0 > 0 || g->accumulate;
        for (int p = p0; p < p1; p += mr) {
            const int m = p1 - p < mr ? p1 - p : mr;
            const float *a[FM_VIS_MR_MAX];
            for (int i = 0; i < mr; i++) a[i] = g->x + (size_t)(p + (i < m ? i : m - 1)) * g->ldx + k0;
            for (int r = r0; r < r1; r += nr) {
                const int nc = r1 - r < nr ? r1 - r : nr;
                const float *sub = panel + (size_t)(r - r0) * kc, *bias = k0 == 0 && g->bias ? g->bias + r : NULL;
                float *c = g->y + (size_t)p * g->ldy + r;
                if (m == mr && nc == nr) {
                    g->kern.fn(kc, a, sub, c, g->ldy, bias, load_c);
                    continue;
                }
                // a partial tile: through a full one on the stack, only its valid part kept
                for (int i = 0; i < m && load_c; i++) memcpy(tmp + i * nr, c + (size_t)i * g->ldy, sizeof(float) * nc);
                g->kern.fn(kc, a, sub, tmp, (size_t)nr, bias, load_c);
                for (int i = 0; i < m; i++) memcpy(c + (size_t)i * g->ldy, tmp + i * nr, sizeof(float) * nc);
            }
        }
    }
    if (g->act) activate(&g->kern, g->act, g->y + (size_t)p0 * g->ldy + r0, g->ldy, p1 - p0, r1 - r0);
}

int fm_vis_gemm(fm_pool *pool, int type, const void *w, size_t row_bytes, int rows, int cols, int n,
                const float *x, size_t ldx, float *y, size_t ldy, const float *bias, int accumulate, int act) {
    if (!(type == FM_F32 || type == FM_F16 || type == FM_BF16 || (type == FM_Q8_0 && cols % QK32 == 0)))
        return -1;
    if (rows < 0 || n < 0 || cols <= 0 || act < 0 || act > 2) return -1;
    if (rows == 0 || n == 0) return 0;
    gemm_ctx g = { KERNELS[fm_isa_active()], type, rows, cols, n, accumulate, act, (rows + RT - 1) / RT,
                   w, row_bytes, ldx, ldy, (size_t)RT * KC + KC, x, NULL, y, NULL };
    const int threads = fm_pool_threads(pool);
    const size_t padded = (size_t)g.row_tiles * RT;
    float *bias_p = NULL;
    g.work = aligned_alloc(64, (sizeof(float) * (g.scratch * (size_t)threads + padded) + 63) & ~(size_t)63);
    if (!g.work) return -1;
    if (bias) {   // whole panels of bias, so a partial tile's kernel reads no further than it
        bias_p = g.work + g.scratch * (size_t)threads;
        memcpy(bias_p, bias, sizeof(float) * (size_t)rows);
        memset(bias_p + rows, 0, sizeof(float) * (padded - (size_t)rows));
        g.bias = bias_p;
    }
    fm_pool_run(pool, gemm_task, &g, g.row_tiles * ((n + NT - 1) / NT));
    free(g.work);
    return 0;
}
