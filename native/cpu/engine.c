/* The native engine: its scratch buffers and the step itself (embedding, every layer, final
 * norm, LM head) for n sequences at one token each, for n tokens of one sequence, or for runs of
 * tokens of several sequences (a verify); and the MTP block's step, whose input mixes each token's
 * embedding with the trunk's hidden. Matvecs of a layer that share an input run as one batch of
 * pool jobs. The layers' parts are in mixers.c, and moe.c or dense_ffn.c (the model's FFN kind); the
 * scratch arena, the matvec jobs and the phase clock that they and this file use, in engine_jobs.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "engine.h"
#include "engine_impl.h"
#include "ops.h"

// ---- scratch

static void free_scratch(fm_engine *e) {
    float **fs[] = { &e->x, &e->xn, &e->cat, &e->p_qkv, &e->p_z, &e->p_alpha, &e->p_beta, &e->p_k, &e->p_v,
                     &e->conv_out, &e->core, &e->attn_out, &e->router, &e->probs, &e->rope,
                     &e->wts, &e->sg, &e->g, &e->u, &e->down };
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) { free(*fs[i]); *fs[i] = NULL; }
    free(e->ids); free(e->arena); free(e->jobs);
    e->ids = NULL; e->arena = NULL; e->jobs = NULL;
    e->cap = 0;
}

static int reserve(fm_engine *e, int n) {
    if (n <= e->cap) return 0;
    free_scratch(e);
    const fm_model *m = e->m;
    const size_t H = m->hidden, C = 2 * (size_t)m->n_k_heads * m->head_k_dim + (size_t)m->n_v_heads * m->head_v_dim;
    const size_t Z = (size_t)m->n_v_heads * m->head_v_dim, QG = 2 * (size_t)m->n_heads * m->head_dim;
    const size_t KV = (size_t)m->n_kv_heads * m->head_dim, AO = (size_t)m->n_heads * m->head_dim;
    const size_t K1 = (size_t)m->n_experts_used + 1, F = MAX(MAX(m->expert_ffn, m->shared_ffn), m->dense_ffn);
    const size_t nv2 = 2 * (size_t)m->n_v_heads, cap = (size_t)n;
    struct { float **p; size_t count; } plan[] = {
        { &e->x, cap * H }, { &e->xn, cap * H }, { &e->cat, m->eh_proj.data ? cap * 2 * H : 0 }, { &e->p_qkv, cap * MAX(C, QG) }, { &e->p_z, cap * MAX(Z, KV) },
        { &e->p_alpha, cap * nv2 }, { &e->p_beta, cap * nv2 }, { &e->p_k, cap * KV }, { &e->p_v, cap * KV },
        { &e->conv_out, cap * C }, { &e->core, cap * MAX(Z, AO) }, { &e->attn_out, cap * H },
        { &e->router, cap * m->n_experts }, { &e->probs, m->n_experts },
        { &e->rope, (size_t)MAX(m->rope_dim, 2) }, { &e->wts, cap * K1 }, { &e->sg, cap },
        { &e->g, cap * K1 * F }, { &e->u, cap * K1 * F }, { &e->down, cap * K1 * H },
    };
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++)
        if (!(*plan[i].p = malloc(sizeof(float) * MAX(plan[i].count, 1)))) goto fail;
    e->ids = malloc(sizeof(int) * cap * K1);
    const size_t widest = MAX(MAX(H, Z), MAX(AO, F));
    e->arena_size = 3 * cap * K1 * (4 * widest + 2 * sizeof(void *) + 128) + (1 << 20);
    e->arena = malloc(e->arena_size);
    e->max_jobs = 2 * (m->n_experts + 2) + 8;
    e->jobs = malloc(sizeof(fm_mv_job) * (size_t)e->max_jobs);
    if (!e->ids || !e->arena || !e->jobs) goto fail;
    e->cap = n;
    return 0;
fail:
    free_scratch(e);
    return -1;
}

// by fm_model.ffn_kind
static const eng_ffn_fn FFNS[] = { eng_moe, eng_dense_ffn };

fm_engine *fm_engine_new(const fm_model *model, fm_pool *pool) {
    if (!fm_kv_head_bytes(model->kv_type, model->head_dim)) return NULL;   // no such cache type for hd
    if (model->ffn_kind < 0 || model->ffn_kind >= (int)(sizeof FFNS / sizeof FFNS[0])) return NULL;
    fm_engine *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->m = model;
    e->ffn = FFNS[model->ffn_kind];
    e->pool = pool;
    e->lin_index = malloc(sizeof(int) * (size_t)model->n_layers);
    e->full_index = malloc(sizeof(int) * (size_t)model->n_layers);
    int nl = 0, nf = 0;
    for (int i = 0; i < model->n_layers; i++) {
        e->lin_index[i] = model->layers[i].is_full ? -1 : nl++;
        e->full_index[i] = model->layers[i].is_full ? nf++ : -1;
    }
    if (reserve(e, 1) != 0) { fm_engine_free(e); return NULL; }
    return e;
}

void fm_engine_free(fm_engine *e) {
    if (!e) return;
    free_scratch(e);
    free(e->scores);
    free(e->lin_index);
    free(e->full_index);
    free(e);
}

double fm_engine_bytes(const fm_engine *e) { return e->bytes; }

int fm_engine_phase_count(void) { return PH_COUNT; }

void fm_engine_phases(const fm_engine *e, double *out) {
    for (int i = 0; i < PH_COUNT; i++) {
        out[2 * i] = e->phase_s[i];
        out[2 * i + 1] = e->phase_bytes[i];
    }
    out[2 * PH_COUNT] = e->step_s;
}

// ---- one step: a decode step (n sequences, one token each), a prefill chunk (n tokens of one
// sequence, in order) or a verify (runs of tokens of several sequences); the logits of the last
// logit_rows rows, and their hidden after the final norm

static void begin_step(fm_engine *e) {
    e->bytes = 0.0;
    e->arena_used = 0;
    e->memo.rows = NULL;
    memset(e->phase_s, 0, sizeof e->phase_s);
    memset(e->phase_bytes, 0, sizeof e->phase_bytes);
}

static void embed_rows(fm_engine *e, int n, const int *tokens) {
    const fm_model *m = e->m;
    for (int b = 0; b < n; b++)
        fm_dequant_row(m->embd.type, (const uint8_t *)m->embd.data + (size_t)tokens[b] * m->embd.row_bytes,
                       e->x + (size_t)b * m->hidden, m->hidden);
    e->bytes += (double)n * m->embd.row_bytes;
}

// the MTP block's input: x = eh_proj [rmsnorm(emb) * enorm; rmsnorm(h) * hnorm]
static int mtp_input_rows(fm_engine *e, int n, const int *tokens, const float *hidden) {
    const fm_model *m = e->m;
    const size_t H = m->hidden;
    embed_rows(e, n, tokens);
    for (int b = 0; b < n; b++) {
        fm_rmsnorm(e->x + b * H, m->enorm, e->cat + 2 * b * H, (int)H, m->rms_eps);
        fm_rmsnorm(hidden + b * H, m->hnorm, e->cat + 2 * b * H + H, (int)H, m->rms_eps);
    }
    if (eng_dense(e, &m->eh_proj, e->cat, n, e->x)) return -1;
    eng_run_jobs(e, PH_MIX_IN);
    return 0;
}

// the rows e->out_rows moved to the front of x: after the last mixer nothing else reads the others
static int keep_out_rows(fm_engine *e) {
    const size_t H = e->m->hidden;
    for (int j = 0; j < e->n_out; j++)
        if (e->out_rows[j] != j) memmove(e->x + j * H, e->x + (size_t)e->out_rows[j] * H, sizeof(float) * H);
    return e->n_out;
}

static int layers_and_head(fm_engine *e, int n, const fm_seq *seqs, int logit_rows, float *logits, float *hidden) {
    const fm_model *m = e->m;
    for (int i = 0; i < m->n_layers; i++) {
        const fm_layer *L = &m->layers[i];
        int err = L->is_full ? eng_full_layer(e, L, e->full_index[i], n, seqs) : eng_linear_layer(e, L, e->lin_index[i], n, seqs);
        if (!err && e->out_rows && i == m->n_layers - 1) n = keep_out_rows(e);
        if (err || e->ffn(e, L, n)) return -1;
    }
    if (logit_rows > 0) {   // the final norm and the LM head for those rows alone
        const size_t skip = (size_t)(n - logit_rows) * m->hidden;
        memmove(e->x, e->x + skip, sizeof(float) * (size_t)logit_rows * m->hidden);
        eng_norm_rows(e, m->out_norm, logit_rows);
        if (hidden) memcpy(hidden, e->xn, sizeof(float) * (size_t)logit_rows * m->hidden);
        if (eng_dense(e, &m->output, e->xn, logit_rows, logits)) return -1;
        eng_run_jobs(e, PH_HEAD);
    }
    return 0;
}

// rows given from outside (an image's, from the vision encoder): n_embd rows of embd at rows `at`
typedef struct { int n; const int *at; const float *embd; } given_rows;

// mtp_hidden NULL: the rows start from the tokens' embeddings (but the given rows); else the MTP block's input
static int step(fm_engine *e, int n, const int *tokens, const float *mtp_hidden, const fm_seq *seqs, int logit_rows,
                float *logits, float *hidden, given_rows given) {
    if (reserve(e, n) != 0) return -1;
    const unsigned mxcsr = fm_flush_denormals();   // internal.h
    const double t0 = eng_seconds();
    begin_step(e);
    int err = 0;
    if (mtp_hidden) err = mtp_input_rows(e, n, tokens, mtp_hidden);
    else embed_rows(e, n, tokens);
    for (int j = 0; j < given.n; j++)
        memcpy(e->x + (size_t)given.at[j] * e->m->hidden, given.embd + (size_t)j * e->m->hidden,
               sizeof(float) * (size_t)e->m->hidden);
    err = err || layers_and_head(e, n, seqs, logit_rows, logits, hidden);
    e->step_s = eng_seconds() - t0;
    _mm_setcsr(mxcsr);
    return err ? -1 : 0;
}

int fm_decode(fm_engine *e, int n, const int *tokens, const fm_seq *seqs, float *logits) {
    return step(e, n, tokens, NULL, seqs, n, logits, NULL, (given_rows){ 0, NULL, NULL });
}

int fm_prefill(fm_engine *e, int n, const int *tokens, const fm_seq *seq, int logit_rows, float *logits) {
    return fm_prefill_embd(e, n, tokens, seq, 0, NULL, NULL, logit_rows, logits);
}

int fm_prefill_embd(fm_engine *e, int n, const int *tokens, const fm_seq *seq, int n_embd, const int *embd_rows,
                    const float *embd, int logit_rows, float *logits) {
    if (n < 1 || logit_rows < 0 || logit_rows > n || n_embd < 0 || (n_embd && (!embd_rows || !embd))) return -1;
    for (int j = 0; j < n_embd; j++)
        if (embd_rows[j] < 0 || embd_rows[j] >= n) return -1;
    fm_seq *rows = malloc(sizeof(fm_seq) * (size_t)n);   // row b: the same buffers at position pos + b
    if (!rows) return -1;
    for (int b = 0; b < n; b++) {
        rows[b] = *seq;
        rows[b].pos = seq->pos + b;
        rows[b].mrope = seq->mrope ? seq->mrope + 3 * (size_t)b : NULL;
    }
    e->chain = 1;
    const int err = step(e, n, tokens, NULL, rows, logit_rows, logits, NULL, (given_rows){ n_embd, embd_rows, embd });
    e->chain = 0;
    free(rows);
    return err;
}

int fm_verify(fm_engine *e, int n_runs, const int *run_rows, const int *tokens, const fm_seq *rows, float *logits,
              float *hidden) {
    if (n_runs < 1 || e->m->eh_proj.data) return -1;
    int *first = malloc(sizeof(int) * (size_t)(n_runs + 1));
    if (!first) return -1;
    first[0] = 0;
    for (int r = 0; r < n_runs; r++) {
        if (run_rows[r] < 1) { free(first); return -1; }
        first[r + 1] = first[r] + run_rows[r];
    }
    e->n_runs = n_runs;
    e->run_first = first;
    const int n = first[n_runs];
    const int err = step(e, n, tokens, NULL, rows, n, logits, hidden, (given_rows){ 0, NULL, NULL });
    e->run_first = NULL;
    free(first);
    return err;
}

int fm_draft(fm_engine *e, int n, const int *tokens, const float *hidden, const fm_seq *seqs, int n_out,
             const int *out_rows, float *logits, float *hidden_out) {
    const fm_model *m = e->m;
    if (n < 1 || !hidden || !m->eh_proj.data || m->n_layers != 1 || !m->layers[0].is_full) return -1;
    if (out_rows) {
        if (n_out < 1 || n_out > n) return -1;
        for (int j = 0; j < n_out; j++)
            if (out_rows[j] < j || out_rows[j] >= n || (j && out_rows[j] <= out_rows[j - 1])) return -1;
    }
    e->n_out = out_rows ? n_out : n;
    e->out_rows = out_rows;
    const int err = step(e, n, tokens, hidden, seqs, e->n_out, logits, hidden_out, (given_rows){ 0, NULL, NULL });
    e->out_rows = NULL;
    return err;
}
