/* The matvec driver: rows of one or many weight matrices split into tasks of contiguous rows,
 * claimed by the pool's threads (task_bytes). Each weight row is read once and dotted with every
 * activation of its job, so a batch costs one pass over the weights. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

// A task's weight bytes: about a quarter of each thread's share of the run, so that the last
// tasks still balance, within [TASK_MIN, TASK_MAX]. Long tasks stream better: each thread reads
// one run of contiguous bytes instead of hopping every 256 KB between places that the other
// threads read too; the floor keeps a small run of many threads from splitting into claims that
// cost more than they read. A run whose jobs carry more activations than one kernel call takes
// (a prefill chunk) is bound by compute, not by the stream: it keeps the smallest tasks, which
// balance best (docs/performance.md).
#define TASK_MIN ((size_t)256 << 10)
#define TASK_MAX ((size_t)2 << 20)
#define TASKS_PER_THREAD 4

static size_t task_bytes(const fm_mv_job *jobs, int n_jobs, int threads) {
    size_t total = 0;
    for (int i = 0; i < n_jobs; i++) {
        if (jobs[i].n > FM_DOTN_MAX) return TASK_MIN;
        total += (size_t)jobs[i].rows * jobs[i].row_bytes;
    }
    const size_t share = total / ((size_t)threads * TASKS_PER_THREAD);
    return share < TASK_MIN ? TASK_MIN : share > TASK_MAX ? TASK_MAX : share;
}

typedef struct {
    const fm_mv_job *jobs;
    int n_jobs;
    int *first_task;     // (n_jobs + 1,) prefix sums of tasks per job
    int *rows_per_task;  // (n_jobs,)
} mv_ctx;

// rows r0..r1 (whole groups) of a repacked matrix: one kernel call per group of rows and
// chunk of activations; a group's rows are stored together, row_bytes each
static void mv_groups(const fm_mv_job *j, int r0, int r1) {
    const fm_vec_dot_g_fn dotg = fm_dotg_for(-1, j->kind);
    for (int r = r0; r < r1; r += FM_GROUP) {
        const uint8_t *w = j->w + (size_t)r * j->row_bytes;
        for (int b = 0; b < j->n; b += FM_DOTN_MAX) {
            float y[FM_DOTN_MAX * FM_GROUP];
            const int na = j->n - b < FM_DOTN_MAX ? j->n - b : FM_DOTN_MAX;
            dotg(j->cols, w, j->acts + b, na, y);
            for (int i = 0; i < na; i++) memcpy(j->outs[b + i] + r, y + FM_GROUP * i, sizeof(float) * FM_GROUP);
        }
    }
}

// rows r0..r1 of a row-layout matrix, up to FM_DOTR_MAX at a time through the ISA's kernel for
// several rows, and every activation of the job through each call
static void mv_rows(const fm_mv_job *j, fm_vec_dot_r_fn dotr, int r0, int r1) {
    for (int r = r0; r < r1; r += FM_DOTR_MAX) {
        const int nr = r1 - r < FM_DOTR_MAX ? r1 - r : FM_DOTR_MAX;
        const uint8_t *w = j->w + (size_t)r * j->row_bytes;
        for (int b = 0; b < j->n; b += FM_DOTN_MAX) {
            float y[FM_DOTN_MAX * FM_DOTR_MAX];
            const int na = j->n - b < FM_DOTN_MAX ? j->n - b : FM_DOTN_MAX;
            dotr(j->cols, w, j->row_bytes, nr, j->acts + b, na, y);
            for (int i = 0; i < na; i++)   // nr floats: a loop, where memcpy was a libc call per row pair
                for (int k = 0; k < nr; k++) j->outs[b + i][r + k] = y[FM_DOTR_MAX * i + k];
        }
    }
}

static void mv_task(void *arg, int task, int thread) {
    (void)thread;
    const mv_ctx *c = arg;
    int lo = 0, hi = c->n_jobs - 1;
    while (lo < hi) {  // the job holding this task
        int mid = (lo + hi + 1) / 2;
        if (c->first_task[mid] <= task) lo = mid; else hi = mid - 1;
    }
    const fm_mv_job *j = &c->jobs[lo];
    const int r0 = (task - c->first_task[lo]) * c->rows_per_task[lo];
    const int r1 = r0 + c->rows_per_task[lo] < j->rows ? r0 + c->rows_per_task[lo] : j->rows;
    // the task's first FM_PREFETCH_AHEAD bytes: the kernels request only beyond what they read
    // (quants.h), and a task (an expert matrix, most often) starts where no stream is running
    const uint8_t *start = j->w + (size_t)r0 * j->row_bytes;
    const size_t span = (size_t)(r1 - r0) * j->row_bytes;
    for (size_t off = 0; off < FM_PREFETCH_AHEAD && off < span; off += 64) _mm_prefetch((const char *)start + off, _MM_HINT_T0);
    if (FM_TYPES[j->kind].group > 1) {
        mv_groups(j, r0, r1);
        return;
    }
    // several rows at once pay off in compute, with several activations; one activation streams
    // faster row by row
    const fm_vec_dot_r_fn dotr = j->n > 1 ? fm_dotr_for(-1, j->kind) : NULL;
    if (dotr) {
        mv_rows(j, dotr, r0, r1);
        return;
    }
    const fm_vec_dot_fn dot = fm_dot_for(-1, j->kind);
    const fm_vec_dot_n_fn dotn = j->n > 1 ? fm_dotn_for(-1, j->kind) : NULL;
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = j->w + (size_t)r * j->row_bytes;
        if (!dotn) {
            for (int b = 0; b < j->n; b++) j->outs[b][r] = dot(j->cols, row, j->acts[b]);
            continue;
        }
        for (int b = 0; b < j->n; b += FM_DOTN_MAX) {   // the row stays in L1 across chunks
            float y[FM_DOTN_MAX];
            const int na = j->n - b < FM_DOTN_MAX ? j->n - b : FM_DOTN_MAX;
            dotn(j->cols, row, j->acts + b, na, y);
            for (int i = 0; i < na; i++) j->outs[b + i][r] = y[i];
        }
    }
}

void fm_mv_run(fm_pool *pool, const fm_mv_job *jobs, int n_jobs) {
    if (n_jobs <= 0) return;
    int stack_first[65], stack_rows[64];
    int *first = n_jobs < 64 ? stack_first : malloc(sizeof(int) * (size_t)(n_jobs + 1));
    int *rows = n_jobs < 64 ? stack_rows : malloc(sizeof(int) * (size_t)n_jobs);
    first[0] = 0;
    const size_t bytes = task_bytes(jobs, n_jobs, fm_pool_threads(pool));
    for (int i = 0; i < n_jobs; i++) {
        const int group = FM_TYPES[jobs[i].kind].group;   // tasks hold whole groups of rows
        int r = (int)(bytes / (jobs[i].row_bytes ? jobs[i].row_bytes : 1)) / group * group;
        rows[i] = r < group ? group : r;
        first[i + 1] = first[i] + (jobs[i].rows + rows[i] - 1) / rows[i];
    }
    mv_ctx c = { jobs, n_jobs, first, rows };
    fm_pool_run(pool, mv_task, &c, first[n_jobs]);
    if (first != stack_first) free(first);
    if (rows != stack_rows) free(rows);
}

void fm_matvec(fm_pool *pool, int type, const void *w, size_t row_bytes, int rows, int cols,
               int n, const float *x, float *y) {
    const size_t ab = fm_act_bytes(type, cols);
    uint8_t *act = malloc(ab * (size_t)n);
    const void **acts = malloc(sizeof(void *) * (size_t)n);
    float **outs = malloc(sizeof(float *) * (size_t)n);
    for (int b = 0; b < n; b++) {
        fm_quantize_act(type, x + (size_t)b * cols, cols, act + ab * b);
        acts[b] = act + ab * b;
        outs[b] = y + (size_t)b * rows;
    }
    fm_mv_job job = { w, row_bytes, fm_kind_of(type), rows, cols, n, acts, outs };
    fm_mv_run(pool, &job, 1);
    free(act);
    free(acts);
    free(outs);
}
