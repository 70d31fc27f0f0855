/* Decode attention over the pool (fermium_cpu.h: fm_attn_decode): one query token for each of n
 * sequences, in tasks of (sequence, KV head, split of its keys). With fewer KV heads than
 * threads, one task per head leaves threads idle while a long cache streams by, so a long
 * sequence's keys are split (flash-decoding): each split's kernel call leaves its softmax
 * unnormalised (O, m, l), and a merge per (sequence, KV head) brings the splits to their common
 * maximum, O = sum_s e^(m_s - m) O_s / sum_s e^(m_s - m) l_s. The group's query heads stay
 * together in every split, so each key block is still read once for all of them. */
#include <math.h>
#include <stddef.h>
#include "fermium_cpu.h"
#include "internal.h"
#include "ops.h"

// the fewest keys a split holds (4 key blocks), so that a split's pass outweighs its merge
#define SPLIT_KEYS 256
// tasks per pool thread that the split aims at: the splits are of equal length, and a second
// task per thread only added a merge and a second pass over the queries
#define TASKS_PER_THREAD 1

typedef struct {
    fm_attn_fn attn;
    int n, nkv, group, hd, kv_type;
    const int *pos, *first, *splits;   // first: (n + 1,) each sequence's first task
    const float *q;
    size_t q_seq, q_head, kv_stride, head_bytes, o_seq, o_head, work_thread;
    const void *const *k, *const *v;
    float *o, *work, *part;            // part: per task, the split's O (group, hd) then (m, l) per row
    float scale;
} decode_ctx;

// keys per split of T keys in s splits, in whole key blocks
static int split_len(int T, int s) {
    const int per = (T + s - 1) / s;
    return (per + FM_ATTN_KEYS - 1) / FM_ATTN_KEYS * FM_ATTN_KEYS;
}

static int split_count(int T, int n, int nkv, int threads, int forced) {
    int s = forced;
    if (s <= 0) {
        s = (TASKS_PER_THREAD * threads + n * nkv - 1) / (n * nkv);
        s = s < T / SPLIT_KEYS ? s : T / SPLIT_KEYS;
    }
    if (s <= 1) return 1;
    const int per = split_len(T, s);
    return (T + per - 1) / per;
}

static size_t part_floats(int group, int hd) { return (size_t)group * (hd + 2); }

// each sequence's splits and first task; returns the tasks
static int plan(int threads, int n, const int *pos, int nkv, int forced, int *splits, int *first) {
    first[0] = 0;
    for (int b = 0; b < n; b++) {
        splits[b] = split_count(pos[b] + 1, n, nkv, threads, forced);
        first[b + 1] = first[b] + nkv * splits[b];
    }
    return first[n];
}

size_t fm_attn_decode_work(int threads, int n, const int *pos, int nkv, int group, int hd, int splits) {
    int s[n > 0 ? n : 1], first[n + 1];
    const int tasks = plan(threads, n, pos, nkv, splits, s, first);
    return (size_t)threads * fm_attn_tiled_work(group, hd) + (size_t)tasks * part_floats(group, hd);
}

static void split_task(void *arg, int t, int thread) {
    const decode_ctx *c = arg;
    int lo = 0, hi = c->n - 1;         // the sequence: the last whose first task is <= t
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (c->first[mid] <= t) lo = mid; else hi = mid - 1;
    }
    const int b = lo, S = c->splits[b], h = (t - c->first[b]) / S, s = (t - c->first[b]) % S, T = c->pos[b] + 1;
    const int per = split_len(T, S), key0 = s * per, key1 = key0 + per < T ? key0 + per : T;
    const float *q = c->q + (size_t)b * c->q_seq + (size_t)h * c->group * c->q_head;
    const char *k = (const char *)c->k[b] + (size_t)h * c->head_bytes, *v = (const char *)c->v[b] + (size_t)h * c->head_bytes;
    float *work = c->work + (size_t)thread * c->work_thread;
    if (S == 1) {
        c->attn(q, c->q_seq, c->q_head, k, v, c->kv_stride, c->kv_type,
                c->o + (size_t)b * c->o_seq + (size_t)h * c->group * c->o_head, c->o_seq, c->o_head, 1, c->pos[b],
                0, T, c->group, c->hd, c->scale, work, NULL);
    } else {
        float *slot = c->part + (size_t)t * part_floats(c->group, c->hd);
        c->attn(q, c->q_seq, c->q_head, k, v, c->kv_stride, c->kv_type, slot, 0, c->hd, 1, c->pos[b], key0, key1,
                c->group, c->hd, c->scale, work, slot + (size_t)c->group * c->hd);
    }
}

static void merge_task(void *arg, int t, int thread) {   // (sequence, KV head)
    (void)thread;
    const decode_ctx *c = arg;
    const int b = t / c->nkv, h = t % c->nkv, S = c->splits[b], hd = c->hd;
    if (S == 1) return;
    const size_t slot = part_floats(c->group, hd);
    const float *part = c->part + (size_t)(c->first[b] + h * S) * slot;
    float w[S];
    for (int g = 0; g < c->group; g++) {
        const float *ml = part + (size_t)c->group * hd + 2 * (size_t)g;
        float mx = -INFINITY, den = 0.0f;
        for (int s = 0; s < S; s++) mx = ml[s * slot] > mx ? ml[s * slot] : mx;
        for (int s = 0; s < S; s++) den += (w[s] = expf(ml[s * slot] - mx)) * ml[s * slot + 1];
        float *out = c->o + (size_t)b * c->o_seq + ((size_t)h * c->group + g) * c->o_head;
        for (int d = 0; d < hd; d++) {
            float acc = 0.0f;
            for (int s = 0; s < S; s++) acc += w[s] * part[s * slot + (size_t)g * hd + d];
            out[d] = acc / den;
        }
    }
}

int fm_attn_decode(fm_pool *pool, int isa, int n, const int *pos, const float *q, size_t q_seq, size_t q_head,
                   const void *const *k, const void *const *v, size_t kv_stride, int kv_type, float *o,
                   size_t o_seq, size_t o_head, int nkv, int group, int hd, float scale, int splits, float *work) {
    const fm_attn_fn attn = fm_attn_for(isa);
    if (!attn || n < 1) return attn ? 0 : -1;
    const int threads = fm_pool_threads(pool);
    int s[n], first[n + 1];
    const int tasks = plan(threads, n, pos, nkv, splits, s, first);
    const size_t wt = fm_attn_tiled_work(group, hd);
    decode_ctx c = { attn, n, nkv, group, hd, kv_type, pos, first, s, q, q_seq, q_head, kv_stride,
                     fm_kv_head_bytes(kv_type, hd), o_seq, o_head, wt, k, v, o, work, work + threads * wt, scale };
    fm_pool_run(pool, split_task, &c, tasks);
    if (tasks > n * nkv) fm_pool_run(pool, merge_task, &c, n * nkv);
    return 0;
}
