/* The vision tower's row ops over the pool (vision.h): LayerNorm, and the 2D rotary from the qkv
 * matmul's rows into the per-head planes that the attention (vision_attn.c) reads. */
#include <math.h>
#include <string.h>
#include "internal.h"
#include "vision.h"

#define ROWS_PER_TASK 16

// ---- LayerNorm

typedef struct {
    const float *x, *w, *b;
    float *y;
    int n, dim;
    float eps;
} ln_ctx;

// the sum of x (or, with `square`, of (x - mean)^2) in LANES float partial sums, which the
// compiler keeps in vector registers where one running sum would be a chain of dependent adds
#define LANES 16
static float lane_sum(const float *x, int n, float mean, int square) {
    float part[LANES] = { 0 };
    int d = 0;
    for (; d + LANES <= n; d += LANES)
        for (int l = 0; l < LANES; l++) {
            const float t = x[d + l] - mean;
            part[l] += square ? t * t : x[d + l];
        }
    float s = 0.0f;
    for (; d < n; d++) s += square ? (x[d] - mean) * (x[d] - mean) : x[d];
    for (int l = 0; l < LANES; l++) s += part[l];
    return s;
}

static void ln_task(void *arg, int task, int thread) {
    (void)thread;
    const ln_ctx *c = arg;
    const int i1 = (task + 1) * ROWS_PER_TASK < c->n ? (task + 1) * ROWS_PER_TASK : c->n;
    for (int i = task * ROWS_PER_TASK; i < i1; i++) {
        const float *x = c->x + (size_t)i * c->dim;
        float *y = c->y + (size_t)i * c->dim;
        const float mean = lane_sum(x, c->dim, 0.0f, 0) / (float)c->dim;
        const float rstd = 1.0f / sqrtf(lane_sum(x, c->dim, mean, 1) / (float)c->dim + c->eps);
        for (int d = 0; d < c->dim; d++) y[d] = (x[d] - mean) * rstd * c->w[d] + c->b[d];
    }
}

void fm_vis_layernorm(fm_pool *pool, const float *x, float *y, int n, int dim, const float *w, const float *b,
                      float eps) {
    ln_ctx c = { x, w, b, y, n, dim, eps };
    fm_pool_run(pool, ln_task, &c, (n + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
}

// ---- the 2D rotary, into planes

typedef struct {
    const float *qkv, *cos, *sin;
    float *q, *k, *v;
    int n, heads, hd;
} rot_ctx;

static void rot_task(void *arg, int task, int thread) {
    (void)thread;
    const rot_ctx *c = arg;
    const int H = c->heads * c->hd, half = c->hd / 2;
    const int i1 = (task + 1) * ROWS_PER_TASK < c->n ? (task + 1) * ROWS_PER_TASK : c->n;
    for (int i = task * ROWS_PER_TASK; i < i1; i++) {
        const float *src = c->qkv + (size_t)i * 3 * H;
        const float *cs = c->cos + (size_t)i * c->hd, *sn = c->sin + (size_t)i * c->hd;
        for (int h = 0; h < c->heads; h++) {
            const size_t at = ((size_t)h * c->n + i) * c->hd;
            float *planes[3] = { c->q + at, c->k + at, c->v + at };
            for (int part = 0; part < 3; part++) {
                const float *x = src + (size_t)part * H + (size_t)h * c->hd;
                float *out = planes[part];
                if (part == 2) {
                    memcpy(out, x, sizeof(float) * (size_t)c->hd);
                } else {
                    for (int d = 0; d < half; d++) out[d] = x[d] * cs[d] - x[d + half] * sn[d];
                    for (int d = half; d < c->hd; d++) out[d] = x[d] * cs[d] + x[d - half] * sn[d];
                }
            }
        }
    }
}

void fm_vis_rotary_split(fm_pool *pool, const float *qkv, const float *cos, const float *sin, int n, int heads,
                         int hd, float *q, float *k, float *v) {
    rot_ctx c = { qkv, cos, sin, q, k, v, n, heads, hd };
    fm_pool_run(pool, rot_task, &c, (n + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
}
