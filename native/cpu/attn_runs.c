/* A verify's attention over the pool: runs of consecutive query rows, each run one sequence's
 * tokens at positions pos0 .. pos0 + rows - 1, in tasks of (run, KV head, split of its keys). A
 * run's rows go through one kernel call per split (causal within the run), so each key block is
 * read once for all of the run's rows and the group's heads, where one decode row per token would
 * read the cache once per row. Splits and their merge are attn_decode.c's (flash-decoding), with
 * an (m, l) pair per (row, head). */
#include <math.h>
#include <stddef.h>
#include "engine_impl.h"
#include "ops.h"

// as attn_decode.c: the fewest keys a split holds, and the tasks per pool thread aimed at
#define SPLIT_KEYS 256
#define TASKS_PER_THREAD 1

typedef struct {
    fm_attn_fn attn;
    const eng_attn_runs_args *a;
    const int *splits, *first_task;    // per run; first_task: (n_runs + 1,)
    const size_t *first_part;          // per run: its first task's part, in floats of part
    size_t work_thread, head_bytes;
} runs_ctx;

static int split_len(int T, int s) {
    const int per = (T + s - 1) / s;
    return (per + FM_ATTN_KEYS - 1) / FM_ATTN_KEYS * FM_ATTN_KEYS;
}

static int split_count(int T, int n_runs, int nkv, int threads) {
    int s = (TASKS_PER_THREAD * threads + n_runs * nkv - 1) / (n_runs * nkv);
    s = s < T / SPLIT_KEYS ? s : T / SPLIT_KEYS;
    if (s <= 1) return 1;
    const int per = split_len(T, s);
    return (T + per - 1) / per;
}

static int run_rows(const eng_attn_runs_args *a, int r) { return a->first[r + 1] - a->first[r]; }

// a split's part: O (rows * group, hd) then (m, l) per (row, head)
static size_t part_floats(int rows, int group, int hd) { return (size_t)rows * group * (hd + 2); }

// each run's splits, first task and first part; returns the tasks (parts: the part floats)
static int plan(const eng_attn_runs_args *a, int threads, int *splits, int *first_task, size_t *first_part,
                size_t *parts) {
    first_task[0] = 0;
    size_t p = 0;
    for (int r = 0; r < a->n_runs; r++) {
        const int rows = run_rows(a, r);
        splits[r] = split_count(a->pos0[r] + rows, a->n_runs, a->nkv, threads);
        first_task[r + 1] = first_task[r] + a->nkv * splits[r];
        first_part[r] = p;
        if (splits[r] > 1) p += (size_t)a->nkv * splits[r] * part_floats(rows, a->group, a->hd);
    }
    *parts = p;
    return first_task[a->n_runs];
}

size_t eng_attn_runs_work(const eng_attn_runs_args *a, int threads) {
    int splits[a->n_runs], first_task[a->n_runs + 1];
    size_t first_part[a->n_runs], parts;
    plan(a, threads, splits, first_task, first_part, &parts);
    return (size_t)threads * fm_attn_tiled_work(a->group, a->hd) + parts;
}

static int run_of_task(const runs_ctx *c, int t) {   // the last run whose first task is <= t
    int lo = 0, hi = c->a->n_runs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (c->first_task[mid] <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
}

static void split_task(void *arg, int t, int thread) {
    const runs_ctx *c = arg;
    const eng_attn_runs_args *a = c->a;
    const int r = run_of_task(c, t), S = c->splits[r], h = (t - c->first_task[r]) / S, s = (t - c->first_task[r]) % S;
    const int rows = run_rows(a, r), T = a->pos0[r] + rows, b0 = a->first[r];
    const int per = split_len(T, S), key0 = s * per, key1 = key0 + per < T ? key0 + per : T;
    const float *q = a->q + (size_t)b0 * a->q_tok + (size_t)h * a->group * a->q_head;
    const char *k = (const char *)a->k[r] + (size_t)h * c->head_bytes, *v = (const char *)a->v[r] + (size_t)h * c->head_bytes;
    float *work = a->work + (size_t)thread * c->work_thread;
    if (S == 1) {
        c->attn(q, a->q_tok, a->q_head, k, v, a->kv_stride, a->kv_type,
                a->o + (size_t)b0 * a->o_tok + (size_t)h * a->group * a->o_head, a->o_tok, a->o_head, rows, a->pos0[r],
                0, T, a->group, a->hd, a->scale, work, NULL);
    } else {
        const size_t gh = (size_t)a->group * a->hd;
        float *part = a->part + c->first_part[r] + (size_t)(h * S + s) * part_floats(rows, a->group, a->hd);
        c->attn(q, a->q_tok, a->q_head, k, v, a->kv_stride, a->kv_type, part, gh, a->hd, rows, a->pos0[r], key0, key1,
                a->group, a->hd, a->scale, work, part + rows * gh);
    }
}

// (run, KV head): the splits brought to their common maximum, row by row and head by head; a
// split wholly after a row's position left it m = -inf and adds nothing
static void merge_task(void *arg, int t, int thread) {
    (void)thread;
    const runs_ctx *c = arg;
    const eng_attn_runs_args *a = c->a;
    const int r = t / a->nkv, h = t % a->nkv, S = c->splits[r], hd = a->hd, group = a->group, rows = run_rows(a, r);
    if (S == 1) return;
    const size_t slot = part_floats(rows, group, hd), gh = (size_t)group * hd;
    const float *part = a->part + c->first_part[r] + (size_t)h * S * slot;
    float w[S];
    for (int i = 0; i < rows; i++)
        for (int g = 0; g < group; g++) {
            const size_t row = (size_t)i * group + g;
            const float *ml = part + rows * gh + 2 * row;
            float mx = -INFINITY, den = 0.0f;
            for (int s = 0; s < S; s++) mx = ml[s * slot] > mx ? ml[s * slot] : mx;
            for (int s = 0; s < S; s++) den += (w[s] = expf(ml[s * slot] - mx)) * ml[s * slot + 1];
            float *out = a->o + (size_t)(a->first[r] + i) * a->o_tok + ((size_t)h * group + g) * a->o_head;
            for (int d = 0; d < hd; d++) {
                float acc = 0.0f;
                for (int s = 0; s < S; s++) acc += w[s] * part[s * slot + row * hd + d];
                out[d] = acc / den;
            }
        }
}

int eng_attn_runs(fm_pool *pool, eng_attn_runs_args *a) {
    const fm_attn_fn attn = fm_attn_for(-1);
    if (!attn || a->n_runs < 1) return attn ? 0 : -1;
    const int threads = fm_pool_threads(pool);
    int splits[a->n_runs], first_task[a->n_runs + 1];
    size_t first_part[a->n_runs], parts;
    const int tasks = plan(a, threads, splits, first_task, first_part, &parts);
    const size_t wt = fm_attn_tiled_work(a->group, a->hd);
    a->part = a->work + (size_t)threads * wt;
    runs_ctx c = { attn, a, splits, first_task, first_part, wt, fm_kv_head_bytes(a->kv_type, a->hd) };
    fm_pool_run(pool, split_task, &c, tasks);
    if (tasks > a->n_runs * a->nkv) fm_pool_run(pool, merge_task, &c, a->n_runs * a->nkv);
    return 0;
}
