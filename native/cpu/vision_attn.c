/* The vision tower's attention (vision.h: fm_vis_attention): every patch of an image attends to
 * every patch, per head, as two matmuls on the GEMM's microkernels with an exact softmax between.
 * Not the decode and prefill attention (attn_tiled_*.c): that is causal over a KV cache, with an
 * online softmax; here the keys are few thousand and all visible, so a block of queries' scores
 * fit a thread's work whole and a query block is two GEMMs.
 *
 * First each head's K and V are packed as GEMM panels: K as "weights" of rows = keys and
 * columns = the head's dims, V of rows = the head's dims and columns = keys. Then a task is one
 * head and QB queries: S[QB, keys] = Q K^T (the microkernel over hd columns), each row's softmax in
 * place, O[QB, hd] = P V in blocks of KC keys (each V block read once for the task's rows), and O
 * divided by the rows' sums. */
#include <stdlib.h>
#include "internal.h"
#include "vision.h"

#define QB 48             // queries per task: whole microkernels of every ISA's MR
#define KC 256            // keys per block of P V
_Static_assert(QB % FM_VIS_AVX2_MR == 0 && QB % FM_VIS_SSSE3_MR == 0 && QB % 4 == 0, "whole microkernels");

typedef struct {
    const fm_vis_kernel *kern;
    const float *q, *k, *v;   // planes [heads, n, hd]
    float *o;                 // [n, heads hd]
    float *kpan, *vpan;       // per head: [kp][hd][NR] and [dp][n][NR]
    float *work;
    size_t head_kpan, head_vpan, wt, lds, ldo;   // floats
    int n, heads, hd, kp, dp, blocks;
    float scale;
} vattn_ctx;

static void pack_task(void *arg, int h, int thread) {
    (void)thread;
    const vattn_ctx *c = arg;
    const int nr = c->kern->nr, n = c->n, hd = c->hd;
    const float *k = c->k + (size_t)h * n * hd, *v = c->v + (size_t)h * n * hd;
    float *kp = c->kpan + (size_t)h * c->head_kpan, *vp = c->vpan + (size_t)h * c->head_vpan;
    for (int j = 0; j < c->kp; j++)           // K^T: panel j holds keys j nr.., column by column
        for (int d = 0; d < hd; d++)
            for (int r = 0; r < nr; r++) {
                const int key = j * nr + r;
                kp[((size_t)j * hd + d) * nr + r] = key < n ? k[(size_t)key * hd + d] : 0.0f;
            }
    for (int j = 0; j < c->dp; j++)           // V: panel j holds dims j nr.., key by key
        for (int key = 0; key < n; key++)
            for (int r = 0; r < nr; r++) {
                const int d = j * nr + r;
                vp[((size_t)j * n + key) * nr + r] = d < hd ? v[(size_t)key * hd + d] : 0.0f;
            }
}

static void attn_task(void *arg, int task, int thread) {
    const vattn_ctx *c = arg;
    const fm_vis_kernel *kern = c->kern;
    const int mr = kern->mr, nr = kern->nr, n = c->n, hd = c->hd;
    const int h = task / c->blocks, i0 = task % c->blocks * QB, m = n - i0 < QB ? n - i0 : QB;
    float *S = c->work + (size_t)thread * c->wt, *O = S + (size_t)QB * c->lds, *sum = O + (size_t)QB * c->ldo;
    const float *q = c->q + ((size_t)h * n + i0) * hd;
    const float *kp = c->kpan + (size_t)h * c->head_kpan, *vp = c->vpan + (size_t)h * c->head_vpan;
    const float *a[FM_VIS_MR_MAX];
    // S = Q K^T; rows past m repeat row m - 1 into S's spare rows (QB is whole microkernels)
    for (int p = 0; p < m; p += mr) {
        for (int i = 0; i < mr; i++) a[i] = q + (size_t)(p + i < m ? p + i : m - 1) * hd;
        for (int j = 0; j < c->kp; j++)
            kern->fn(hd, a, kp + (size_t)j * hd * nr, S + (size_t)p * c->lds + (size_t)j * nr, c->lds, NULL, 0);
    }
    for (int r = 0; r < m; r++) sum[r] = kern->softmax(S + (size_t)r * c->lds, n, c->scale);
    // O = P V, a block of keys at a time
    for (int k0 = 0; k0 < n; k0 += KC) {
        const int kc = n - k0 < KC ? n - k0 : KC;
        for (int p = 0; p < m; p += mr) {
            for (int i = 0; i < mr; i++) a[i] = S + (size_t)(p + i < m ? p + i : m - 1) * c->lds + k0;
            for (int j = 0; j < c->dp; j++)
                kern->fn(kc, a, vp + ((size_t)j * n + k0) * nr, O + (size_t)p * c->ldo + (size_t)j * nr, c->ldo,
                         NULL, k0 > 0);
        }
    }
    for (int r = 0; r < m; r++) {
        const float inv = 1.0f / sum[r];
        float *out = c->o + (size_t)(i0 + r) * c->heads * hd + (size_t)h * hd;
        for (int d = 0; d < hd; d++) out[d] = O[(size_t)r * c->ldo + d] * inv;
    }
}

int fm_vis_attention(fm_pool *pool, const float *q, const float *k, const float *v, int n, int heads, int hd,
                     float scale, float *o) {
    const fm_vis_kernel *kern = fm_vis_kernel_active();
    const int nr = kern->nr, kp = (n + nr - 1) / nr, dp = (hd + nr - 1) / nr;
    vattn_ctx c = { kern, q, k, v, o, NULL, NULL, NULL, (size_t)kp * hd * nr, (size_t)dp * n * nr, 0,
                    (size_t)kp * nr, (size_t)dp * nr, n, heads, hd, kp, dp, (n + QB - 1) / QB, scale };
    c.wt = QB * (c.lds + c.ldo + 1);
    const size_t panels = (c.head_kpan + c.head_vpan) * (size_t)heads;
    c.kpan = malloc(sizeof(float) * (panels + c.wt * (size_t)fm_pool_threads(pool)));
    if (!c.kpan) return -1;
    c.vpan = c.kpan + c.head_kpan * (size_t)heads;
    c.work = c.vpan + c.head_vpan * (size_t)heads;
    fm_pool_run(pool, pack_task, &c, heads);
    fm_pool_run(pool, attn_task, &c, heads * c.blocks);
    free(c.kpan);
    return 0;
}
