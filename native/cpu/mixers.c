/* The token mixers of one step: Gated DeltaNet (conv update, recurrent delta rule, gated norm)
 * and gated full attention (q/k norms, partial RoPE, KV append, GQA, output gate). Per-head work
 * runs as pool tasks, the recurrences per run of one sequence's rows in order (engine_impl.h:
 * eng_runs); the KV cache is kept in the model's kv_type. Every row's keys and values are stored
 * before any row attends, so a row attends to the earlier rows of its sequence in the same step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "engine_impl.h"
#include "ops.h"

// ---- Gated DeltaNet layer

typedef struct { fm_engine *e; const fm_layer *L; const fm_seq *seqs; int li, n; } layer_ctx;

// the conv update's channels split into parts of whole heads: per sequence in a decode step; in a
// prefill, where the rows take turns through each part, more parts to share among the threads
#define CONV_TASKS 4
#define CONV_TASKS_CHAIN 16

// the first conv channel of head unit u: nk query heads, nk key heads (dk channels), then nv
// value heads (dv channels)
static size_t unit_channel(const fm_model *m, int u) {
    const int nk = m->n_k_heads;
    return u < 2 * nk ? (size_t)u * m->head_k_dim : 2 * (size_t)nk * m->head_k_dim + (size_t)(u - 2 * nk) * m->head_v_dim;
}

// conv update and SiLU of run `part` (of `parts`) of whole heads of row b, then the query and
// key heads' L2 norms (the query's with the 1/sqrt(dk) scale)
static void conv_run(const layer_ctx *c, int b, int part, int parts) {
    const fm_model *m = c->e->m;
    const int nk = m->n_k_heads, dk = m->head_k_dim, K = m->conv_kernel, units = 2 * nk + m->n_v_heads;
    const int u0 = units * part / parts, u1 = units * (part + 1) / parts;
    const size_t C = unit_channel(m, units), c0 = unit_channel(m, u0), c1 = unit_channel(m, u1);
    float *co = c->e->conv_out + (size_t)b * C;
    fm_conv_update(c->seqs[b].conv[c->li] + c0 * (K - 1), c->L->conv_w + c0 * K, c->e->p_qkv + (size_t)b * C + c0,
                   co + c0, (int)(c1 - c0), K);
    for (int u = u0; u < u1 && u < 2 * nk; u++)
        fm_l2norm_scale(co + (size_t)u * dk, dk, 1e-6f, u < nk ? 1.0f / sqrtf((float)dk) : 1.0f);
}

// a verify's row b > b0 of a run starts from the state the row before it left, in its own buffer
static int own_state(float *const *mine, float *const *before, int li) {
    return mine[li] != before[li];
}

// (run, part): the run's rows in order through this part of the channels
static void conv_task(void *arg, int task, int thread) {
    (void)thread;
    const layer_ctx *c = arg;
    const fm_model *m = c->e->m;
    const int parts = eng_runs(c->e, c->n) == c->n ? CONV_TASKS : CONV_TASKS_CHAIN, part = task % parts;
    const int units = 2 * m->n_k_heads + m->n_v_heads, K1 = m->conv_kernel - 1;
    int b0, b1;
    eng_run_span(c->e, c->n, task / parts, &b0, &b1);
    for (int b = b0; b < b1; b++) {
        if (b > b0 && own_state(c->seqs[b].conv, c->seqs[b - 1].conv, c->li)) {
            const size_t c0 = unit_channel(m, units * part / parts), c1 = unit_channel(m, units * (part + 1) / parts);
            memcpy(c->seqs[b].conv[c->li] + c0 * K1, c->seqs[b - 1].conv[c->li] + c0 * K1, sizeof(float) * (c1 - c0) * K1);
        }
        conv_run(c, b, part, parts);
    }
}

// the decay and the beta of value head p of sequence b
static void gdn_gates(const fm_engine *e, const fm_layer *L, int b, int p, float *decay, float *beta) {
    const int nv = e->m->n_v_heads, r = nv / e->m->n_k_heads;
    float a, bt;
    if (L->alpha.data) {
        a = e->p_alpha[(size_t)b * nv + p];
        bt = e->p_beta[(size_t)b * nv + p];
    } else {  // per key head: r beta rows then r alpha rows
        const float *ba = e->p_alpha + (size_t)b * 2 * nv + (size_t)(p / r) * 2 * r;
        bt = ba[p % r];
        a = ba[r + p % r];
    }
    *decay = expf(L->ssm_a[p] * fm_softplus(a + L->dt_bias[p]));
    *beta = fm_sigmoid(bt);
}

// the delta rule and gated norm of value head p of row b, from the state S0 of the head
// (stream: its new state is one that nothing reads again this step)
static void gdn_run(const layer_ctx *c, int b, int p, const float *S0, int stream) {
    const fm_model *m = c->e->m;
    const int nv = m->n_v_heads, dk = m->head_k_dim, dv = m->head_v_dim, nk = m->n_k_heads;
    const int kh = m->v_tiled ? p % nk : p / (nv / nk);
    const size_t C = 2 * (size_t)nk * dk + (size_t)nv * dv;
    const float *co = c->e->conv_out + (size_t)b * C;
    float *o = c->e->core + (size_t)b * nv * dv + (size_t)p * dv;
    float decay, beta;
    gdn_gates(c->e, c->L, b, p, &decay, &beta);
    fm_gdn_head(S0, c->seqs[b].ssm[c->li] + (size_t)p * dk * dv, co + (size_t)kh * dk, co + (size_t)(nk + kh) * dk,
                co + 2 * (size_t)nk * dk + (size_t)p * dv, decay, beta, o, dk, dv, stream);
    // gated norm: rmsnorm(o) * w * silu(z)
    const float *z = c->e->p_z + (size_t)b * nv * dv + (size_t)p * dv;
    fm_rmsnorm(o, c->L->ssm_norm, o, dv, m->rms_eps);
    fm_mul_silu(o, z, dv);
}

// (run, head): the run's rows in order; a head's state stays in cache from row to row. A verify
// row with its own state buffer (a rollback slot) updates from the row before it into that
// buffer; the run's last such row streams its state past the caches, as no row reads it after
static void gdn_task(void *arg, int task, int thread) {
    (void)thread;
    const layer_ctx *c = arg;
    const fm_model *m = c->e->m;
    const int p = task % m->n_v_heads;
    const size_t head = (size_t)m->head_k_dim * m->head_v_dim;
    int b0, b1;
    eng_run_span(c->e, c->n, task / m->n_v_heads, &b0, &b1);
    for (int b = b0; b < b1; b++) {
        const int own = b > b0 && own_state(c->seqs[b].ssm, c->seqs[b - 1].ssm, c->li);
        const float *S0 = (own ? c->seqs[b - 1].ssm[c->li] : c->seqs[b].ssm[c->li]) + p * head;
        gdn_run(c, b, p, S0, own && b == b1 - 1);
    }
}

// one pool task per (run, head), timed as the mixer heads with the bytes they move
static void run_heads(fm_engine *e, fm_task_fn fn, layer_ctx *c, int tasks, double bytes) {
    const double t0 = eng_seconds();
    fm_pool_run(e->pool, fn, c, tasks);
    eng_phase_since(e, PH_HEADS, t0);
    e->phase_bytes[PH_HEADS] += bytes;
}

int eng_linear_layer(fm_engine *e, const fm_layer *L, int li, int n, const fm_seq *seqs) {
    const fm_model *m = e->m;
    const int nv = m->n_v_heads, dk = m->head_k_dim, dv = m->head_v_dim;
    eng_norm_rows(e, L->attn_norm, n);
    int err = eng_dense(e, &L->qkv, e->xn, n, e->p_qkv) | eng_dense(e, &L->z, e->xn, n, e->p_z);
    if (L->alpha.data)
        err |= eng_dense(e, &L->alpha, e->xn, n, e->p_alpha) | eng_dense(e, &L->beta, e->xn, n, e->p_beta);
    else
        err |= eng_dense(e, &L->ba, e->xn, n, e->p_alpha);
    if (err) return -1;
    eng_run_jobs(e, PH_MIX_IN);
    const double t0 = eng_seconds();
    layer_ctx c = { e, L, seqs, li, n };
    const int runs = eng_runs(e, n);
    fm_pool_run(e->pool, conv_task, &c, runs * (runs == n ? CONV_TASKS : CONV_TASKS_CHAIN));
    eng_phase_since(e, PH_MIX_PREP, t0);
    int states = runs;   // the states read and written: one per run, and one more per row that copies
    for (int r = 0; r < runs; r++) {
        int b0, b1;
        eng_run_span(e, n, r, &b0, &b1);
        for (int b = b0 + 1; b < b1; b++)
            states += own_state(seqs[b].ssm, seqs[b - 1].ssm, li);
    }
    run_heads(e, gdn_task, &c, runs * nv, states * 2.0 * sizeof(float) * nv * dk * dv);
    if (eng_dense(e, &L->ssm_out, e->core, n, e->attn_out)) return -1;
    eng_run_jobs(e, PH_MIX_OUT);
    eng_add_rows(e->x, e->attn_out, n, m->hidden);
    return 0;
}

// ---- gated full attention layer

// prefill: the tiled attention of query heads [h0, h0 + group) for tokens i0..i0+ni-1 of the
// chunk; the same kernel as a decode step's unsplit call (fm_attn_decode), so that a prompt
// prefilled in chunks attends as the same tokens decoded one by one
static void attn_chain_group(const layer_ctx *c, int kvh, int i0, int ni, int thread) {
    fm_engine *e = c->e;
    const fm_model *m = e->m;
    const int nh = m->n_heads, hd = m->head_dim, nkv = m->n_kv_heads, group = nh / nkv;
    const size_t q_tok = 2 * (size_t)nh * hd, o_tok = (size_t)nh * hd, h0 = (size_t)kvh * group;
    const size_t head = fm_kv_head_bytes(m->kv_type, hd);
    const float *qg = e->p_qkv + (size_t)i0 * q_tok + h0 * 2 * hd;   // per head: query then gate
    float *o = e->core + (size_t)i0 * o_tok + h0 * hd;
    float *work = e->scores + (size_t)thread * (e->scores_cap / fm_pool_threads(e->pool));
    const int pos0 = c->seqs[0].pos + i0;
    fm_attn_tiled(qg, q_tok, 2 * (size_t)hd, (const char *)c->seqs[0].k[c->li] + kvh * head,
                  (const char *)c->seqs[0].v[c->li] + kvh * head, nkv * head, m->kv_type, o, o_tok, hd, ni, pos0,
                  0, pos0 + ni, group, hd, 1.0f / sqrtf((float)hd), work, NULL);
}

// the output gate of sequence (or token) b's query heads of KV head kvh
static void attn_gate(const layer_ctx *c, int b, int kvh) {
    const fm_model *m = c->e->m;
    const int nh = m->n_heads, hd = m->head_dim, group = nh / m->n_kv_heads;
    for (int g = kvh * group; g < (kvh + 1) * group; g++)
        fm_mul_sigmoid(c->e->core + (size_t)b * nh * hd + (size_t)g * hd,
                       c->e->p_qkv + (size_t)b * 2 * nh * hd + (size_t)(2 * g + 1) * hd, hd);
}

static void gate_task(void *arg, int task, int thread) {   // decode: (sequence, KV head)
    (void)thread;
    const layer_ctx *c = arg;
    attn_gate(c, task / c->e->m->n_kv_heads, task % c->e->m->n_kv_heads);
}

// prefill: (KV head, block of query tokens), the blocks nearest the chunk's end (the most keys)
// first, so that the pool's last tasks are short
static void attn_chain_task(void *arg, int task, int thread) {
    const layer_ctx *c = arg;
    const int nkv = c->e->m->n_kv_heads, bq = fm_attn_block_tokens(c->e->m->n_heads / nkv);
    const int i0 = ((c->n + bq - 1) / bq - 1 - task / nkv) * bq, ni = c->n - i0 < bq ? c->n - i0 : bq;
    attn_chain_group(c, task % nkv, i0, ni, thread);
    for (int i = i0; i < i0 + ni; i++) attn_gate(c, i, task % nkv);
}

// which of a row's (T, H, W) positions frequency i follows (engine.h: rope_sections)
static int mrope_axis(const fm_model *m, int i) {
    if (i % 3 == 1 && i < 3 * m->rope_sections[1]) return 1;
    if (i % 3 == 2 && i < 3 * m->rope_sections[2]) return 2;
    return 0;
}

// the row's cos and sin: text at pos + rope_delta, a row with (T, H, W) positions frequency by frequency
static void rope_table(fm_engine *e, const fm_seq *s) {
    const int half = e->m->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        const int pos = s->mrope ? s->mrope[mrope_axis(e->m, i)] : s->pos + s->rope_delta;
        const double angle = pos * pow((double)e->m->rope_theta, -2.0 * i / e->m->rope_dim);
        e->rope[i] = (float)cos(angle);
        e->rope[half + i] = (float)sin(angle);
    }
}

// the attention work: one kernel's per pool thread, and in a decode or a verify the parts of the
// splits (runs: a verify's, else NULL)
static int reserve_scores(fm_engine *e, int n, const fm_seq *seqs, const eng_attn_runs_args *runs) {
    const fm_model *m = e->m;
    const int group = m->n_heads / m->n_kv_heads, threads = fm_pool_threads(e->pool);
    size_t need = (size_t)threads * fm_attn_tiled_work(group, m->head_dim);
    if (runs) {
        need = eng_attn_runs_work(runs, threads);
    } else if (!e->chain) {
        int pos[n];
        for (int b = 0; b < n; b++) pos[b] = seqs[b].pos;
        need = fm_attn_decode_work(threads, n, pos, m->n_kv_heads, group, m->head_dim, 0);
    }
    if (need <= e->scores_cap) return 0;
    free(e->scores);
    e->scores_cap = MAX(need, 2 * e->scores_cap);
    e->scores_cap += (threads - e->scores_cap % threads) % threads;   // whole slices per thread
    if (!(e->scores = malloc(sizeof(float) * e->scores_cap))) { e->scores_cap = 0; return -1; }
    return 0;
}

int eng_full_layer(fm_engine *e, const fm_layer *L, int fi, int n, const fm_seq *seqs) {
    const fm_model *m = e->m;
    const int nh = m->n_heads, hd = m->head_dim, nkv = m->n_kv_heads;
    const size_t head = fm_kv_head_bytes(m->kv_type, hd);
    eng_norm_rows(e, L->attn_norm, n);
    if (eng_dense(e, &L->q, e->xn, n, e->p_qkv) | eng_dense(e, &L->k, e->xn, n, e->p_k) | eng_dense(e, &L->v, e->xn, n, e->p_v))
        return -1;
    eng_run_jobs(e, PH_MIX_IN);
    const double t0 = eng_seconds();
    for (int b = 0; b < n; b++) {
        rope_table(e, &seqs[b]);
        for (int h = 0; h < nh; h++) {
            float *q = e->p_qkv + (size_t)b * 2 * nh * hd + (size_t)h * 2 * hd;
            fm_rmsnorm(q, L->q_norm, q, hd, m->rms_eps);
            fm_rope_neox(q, m->rope_dim, e->rope);
        }
        char *kc = (char *)seqs[b].k[fi] + (size_t)seqs[b].pos * nkv * head;
        char *vc = (char *)seqs[b].v[fi] + (size_t)seqs[b].pos * nkv * head;
        for (int h = 0; h < nkv; h++) {   // K after its norm and RoPE, and V, in the cache's type
            float *kr = e->p_k + ((size_t)b * nkv + h) * hd;
            fm_rmsnorm(kr, L->k_norm, kr, hd, m->rms_eps);
            fm_rope_neox(kr, m->rope_dim, e->rope);
            fm_kv_store(m->kv_type, kr, kc + h * head, hd);
            fm_kv_store(m->kv_type, e->p_v + ((size_t)b * nkv + h) * hd, vc + h * head, hd);
        }
    }
    // a verify: each sequence's rows attend together, its cache read once for all of them
    const int runs = e->run_first ? e->n_runs : 0, slots = runs > 0 ? runs : 1;
    int pos0[slots];
    const void *rk[slots], *rv[slots];
    for (int r = 0; r < runs; r++) {
        const fm_seq *s = &seqs[e->run_first[r]];
        pos0[r] = s->pos;
        rk[r] = s->k[fi];
        rv[r] = s->v[fi];
    }
    eng_attn_runs_args ra = { runs, e->run_first, pos0, e->p_qkv, 2 * (size_t)nh * hd, 2 * (size_t)hd, rk, rv,
                              nkv * head, m->kv_type, e->core, (size_t)nh * hd, hd, nkv, nh / nkv, hd,
                              1.0f / sqrtf((float)hd), NULL, NULL };
    if (reserve_scores(e, n, seqs, runs ? &ra : NULL)) return -1;
    eng_phase_since(e, PH_MIX_PREP, t0);
    layer_ctx c = { e, L, seqs, fi, n };
    const int bq = e->chain ? fm_attn_block_tokens(nh / nkv) : 1;
    double kv_bytes = 0.0;   // the keys and values read: once per sequence or run, or per block of the chunk
    if (runs)
        for (int r = 0; r < runs; r++) kv_bytes += 2.0 * head * (seqs[e->run_first[r + 1] - 1].pos + 1) * nkv;
    else
        for (int b = 0; b < n; b += bq)
            kv_bytes += 2.0 * head * (seqs[(b + bq < n ? b + bq : n) - 1].pos + 1) * nkv;
    if (e->chain) {
        run_heads(e, attn_chain_task, &c, nkv * ((n + bq - 1) / bq), kv_bytes);
    } else {
        const double t1 = eng_seconds();
        if (runs) {
            ra.work = e->scores;
            if (eng_attn_runs(e->pool, &ra)) return -1;
        } else {
            int pos[n];
            const void *ks[n], *vs[n];
            for (int b = 0; b < n; b++) { pos[b] = seqs[b].pos; ks[b] = seqs[b].k[fi]; vs[b] = seqs[b].v[fi]; }
            fm_attn_decode(e->pool, -1, n, pos, e->p_qkv, 2 * (size_t)nh * hd, 2 * (size_t)hd, ks, vs, nkv * head,
                           m->kv_type, e->core, (size_t)nh * hd, hd, nkv, nh / nkv, hd, 1.0f / sqrtf((float)hd), 0,
                           e->scores);
        }
        fm_pool_run(e->pool, gate_task, &c, n * nkv);
        eng_phase_since(e, PH_HEADS, t1);
        e->phase_bytes[PH_HEADS] += kv_bytes;
    }
    if (eng_dense(e, &L->o, e->core, n, e->attn_out)) return -1;
    eng_run_jobs(e, PH_MIX_OUT);
    eng_add_rows(e->x, e->attn_out, n, m->hidden);
    return 0;
}
