/* What the engine's step (engine.c) and its layer files (mixers.c, moe.c, dense_ffn.c) share: the
 * scratch arena, the matvec jobs that a phase runs as one batch of pool tasks, the phase clock, and
 * the row helpers around the norms. Below the layers: it calls none of them. */
#include <time.h>
#include "engine_impl.h"
#include "ops.h"

// ---- scratch

void *eng_arena_alloc(fm_engine *e, size_t bytes) {
    bytes = (bytes + 63) & ~(size_t)63;
    if (e->arena_used + bytes > e->arena_size) return NULL;
    void *p = e->arena + e->arena_used;
    e->arena_used += bytes;
    return p;
}

// ---- matvec jobs

const void **eng_quant_rows(fm_engine *e, int type, const float *x, int n, int cols, size_t stride) {
    const int act = FM_TYPES[fm_kind_of(type)].act;
    const quant_memo *m = &e->memo;
    if (m->rows && m->x == x && m->act == act && m->n == n && m->cols == cols && m->stride == stride)
        return m->rows;   // the same rows, already in this activation format
    const size_t ab = fm_act_bytes(type, cols);
    uint8_t *buf = eng_arena_alloc(e, ab * (size_t)n);
    const void **ptrs = eng_arena_alloc(e, sizeof(void *) * (size_t)n);
    if (!buf || !ptrs) return NULL;
    for (int b = 0; b < n; b++) {
        fm_quantize_act(type, x + (size_t)b * stride, cols, buf + ab * b);
        ptrs[b] = buf + ab * b;
    }
    e->memo = (quant_memo){ x, act, n, cols, stride, ptrs };
    return ptrs;
}

float **eng_out_rows(fm_engine *e, float *base, int n, size_t stride) {
    float **ptrs = eng_arena_alloc(e, sizeof(float *) * (size_t)n);
    if (ptrs)
        for (int b = 0; b < n; b++) ptrs[b] = base + (size_t)b * stride;
    return ptrs;
}

int eng_add_job(fm_engine *e, const fm_weight *w, int mat, int n, const void **acts, float **outs) {
    if (!acts || !outs || e->n_jobs == e->max_jobs) return -1;
    e->jobs[e->n_jobs++] = (fm_mv_job){ (const uint8_t *)w->data + (size_t)mat * w->mat_bytes, w->row_bytes,
                                        fm_kind_of(w->type), w->rows, w->cols, n, acts, (float *const *)outs };
    return 0;
}

int eng_dense(fm_engine *e, const fm_weight *w, const float *x, int n, float *y) {
    return eng_add_job(e, w, 0, n, eng_quant_rows(e, w->type, x, n, w->cols, (size_t)w->cols),
                   eng_out_rows(e, y, n, (size_t)w->rows));
}

double eng_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void eng_phase_since(fm_engine *e, int phase, double t0) {
    e->phase_s[phase] += eng_seconds() - t0;
}

void eng_run_jobs(fm_engine *e, int phase) {
    double bytes = 0.0;   // the step's weight bytes: these runs' and the embedding rows
    for (int i = 0; i < e->n_jobs; i++) bytes += (double)e->jobs[i].rows * (double)e->jobs[i].row_bytes;
    e->phase_bytes[phase] += bytes;
    e->bytes += bytes;
    const double t0 = eng_seconds();
    fm_mv_run(e->pool, e->jobs, e->n_jobs);
    eng_phase_since(e, phase, t0);
    e->n_jobs = 0;
    e->memo.rows = NULL;   // the next phase's inputs are new
}

// ---- rows

void eng_add_rows(float *x, const float *y, int n, int H) {
    for (size_t i = 0; i < (size_t)n * H; i++) x[i] += y[i];
}

void eng_norm_rows(fm_engine *e, const float *w, int n) {
    e->arena_used = 0;
    e->memo.rows = NULL;
    for (int b = 0; b < n; b++)
        fm_rmsnorm(e->x + (size_t)b * e->m->hidden, w, e->xn + (size_t)b * e->m->hidden, e->m->hidden, e->m->rms_eps);
}
