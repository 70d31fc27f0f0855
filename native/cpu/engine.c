/* The native decode engine: embedding, every layer (Gated DeltaNet or gated attention, then
 * the MoE), final norm and LM head, for n sequences at one token each. Matvecs of a layer
 * that share an input run as one batch of pool jobs; per-head work runs as pool tasks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "engine.h"
#include "internal.h"
#include "ops.h"

#define MAX(a, b) ((a) > (b) ? (a) : (b))

struct fm_engine {
    const fm_model *m;
    fm_pool *pool;
    int cap;                      // batch capacity of the scratch below
    int *lin_index, *full_index;  // (n_layers,) position among linear / full layers, or -1
    // scratch, each (cap, ...)
    float *x, *xn;                // (cap, H)
    float *p_qkv, *p_z, *p_alpha, *p_beta, *p_k, *p_v;
    float *conv_out, *core, *attn_out, *gates;   // gates: (cap, nv) decay then (cap, nv) beta
    float *router, *probs, *rope;
    int *ids;
    float *wts, *sg, *g, *u, *down;   // g, u: (cap*(K+1), maxF); down: (cap*(K+1), H)
    float *scores;
    size_t scores_cap;
    uint8_t *arena;               // activations and pointer lists of the current phase
    size_t arena_size, arena_used;
    fm_mv_job *jobs;
    int n_jobs, max_jobs;
    double bytes;
};

// ---- scratch

static void *arena_alloc(fm_engine *e, size_t bytes) {
    bytes = (bytes + 63) & ~(size_t)63;
    if (e->arena_used + bytes > e->arena_size) return NULL;
    void *p = e->arena + e->arena_used;
    e->arena_used += bytes;
    return p;
}

static void free_scratch(fm_engine *e) {
    float **fs[] = { &e->x, &e->xn, &e->p_qkv, &e->p_z, &e->p_alpha, &e->p_beta, &e->p_k, &e->p_v,
                     &e->conv_out, &e->core, &e->attn_out, &e->gates, &e->router, &e->probs, &e->rope,
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
    const size_t K1 = (size_t)m->n_experts_used + 1, F = MAX(m->expert_ffn, m->shared_ffn);
    const size_t nv2 = 2 * (size_t)m->n_v_heads, cap = (size_t)n;
    struct { float **p; size_t count; } plan[] = {
        { &e->x, cap * H }, { &e->xn, cap * H }, { &e->p_qkv, cap * MAX(C, QG) }, { &e->p_z, cap * MAX(Z, KV) },
        { &e->p_alpha, cap * nv2 }, { &e->p_beta, cap * nv2 }, { &e->p_k, cap * KV }, { &e->p_v, cap * KV },
        { &e->conv_out, cap * C }, { &e->core, cap * MAX(Z, AO) }, { &e->attn_out, cap * H },
        { &e->gates, 2 * cap * nv2 }, { &e->router, cap * m->n_experts }, { &e->probs, m->n_experts },
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

fm_engine *fm_engine_new(const fm_model *model, fm_pool *pool) {
    fm_engine *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->m = model;
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

// ---- matvec jobs

// n rows of x (stride floats apart) quantized for weights of `type`; NULL when out of arena
static const void **quant_rows(fm_engine *e, int type, const float *x, int n, int cols, size_t stride) {
    const size_t ab = fm_act_bytes(type, cols);
    uint8_t *buf = arena_alloc(e, ab * (size_t)n);
    const void **ptrs = arena_alloc(e, sizeof(void *) * (size_t)n);
    if (!buf || !ptrs) return NULL;
    for (int b = 0; b < n; b++) {
        fm_quantize_act(type, x + (size_t)b * stride, cols, buf + ab * b);
        ptrs[b] = buf + ab * b;
    }
    return ptrs;
}

static float **out_rows(fm_engine *e, float *base, int n, size_t stride) {
    float **ptrs = arena_alloc(e, sizeof(float *) * (size_t)n);
    if (ptrs)
        for (int b = 0; b < n; b++) ptrs[b] = base + (size_t)b * stride;
    return ptrs;
}

static int add_job(fm_engine *e, const fm_weight *w, int mat, int n, const void **acts, float **outs) {
    if (!acts || !outs || e->n_jobs == e->max_jobs) return -1;
    e->jobs[e->n_jobs++] = (fm_mv_job){ (const uint8_t *)w->data + (size_t)mat * w->mat_bytes, w->row_bytes,
                                        fm_kind_of(w->type), w->rows, w->cols, n, acts, (float *const *)outs };
    e->bytes += (double)w->rows * (double)w->row_bytes;
    return 0;
}

// dense: y[b, :rows] = W x[b] for all n tokens, x rows `cols` apart, y rows `rows` apart
static int dense(fm_engine *e, const fm_weight *w, const float *x, int n, float *y) {
    return add_job(e, w, 0, n, quant_rows(e, w->type, x, n, w->cols, (size_t)w->cols),
                   out_rows(e, y, n, (size_t)w->rows));
}

static void run_jobs(fm_engine *e) {
    fm_mv_run(e->pool, e->jobs, e->n_jobs);
    e->n_jobs = 0;
}

static void add_rows(float *x, const float *y, int n, int H) {
    for (size_t i = 0; i < (size_t)n * H; i++) x[i] += y[i];
}

// every phase starts from the norm of the residual: it also recycles the arena
static void norm_rows(fm_engine *e, const float *w, int n) {
    e->arena_used = 0;
    for (int b = 0; b < n; b++)
        fm_rmsnorm(e->x + (size_t)b * e->m->hidden, w, e->xn + (size_t)b * e->m->hidden, e->m->hidden, e->m->rms_eps);
}

// ---- Gated DeltaNet layer

typedef struct { fm_engine *e; const fm_layer *L; const fm_seq *seqs; int li; } layer_ctx;

static void gdn_task(void *arg, int task, int thread) {
    (void)thread;
    const layer_ctx *c = arg;
    const fm_model *m = c->e->m;
    const int nv = m->n_v_heads, dk = m->head_k_dim, dv = m->head_v_dim, nk = m->n_k_heads;
    const int b = task / nv, p = task % nv;
    const int kh = m->v_tiled ? p % nk : p / (nv / nk);
    const size_t C = 2 * (size_t)nk * dk + (size_t)nv * dv;
    const float *co = c->e->conv_out + (size_t)b * C;
    float *o = c->e->core + (size_t)b * nv * dv + (size_t)p * dv;
    const float *gates = c->e->gates + (size_t)b * 2 * nv;
    fm_gdn_head(c->seqs[b].ssm[c->li] + (size_t)p * dk * dv, co + (size_t)kh * dk, co + (size_t)(nk + kh) * dk,
                co + 2 * (size_t)nk * dk + (size_t)p * dv, gates[p], gates[nv + p], o, dk, dv);
    // gated norm: rmsnorm(o) * w * silu(z)
    const float *z = c->e->p_z + (size_t)b * nv * dv + (size_t)p * dv;
    fm_rmsnorm(o, c->L->ssm_norm, o, dv, m->rms_eps);
    for (int j = 0; j < dv; j++) o[j] *= fm_silu(z[j]);
}

static int linear_layer(fm_engine *e, const fm_layer *L, int li, int n, const fm_seq *seqs) {
    const fm_model *m = e->m;
    const int nv = m->n_v_heads, nk = m->n_k_heads, dk = m->head_k_dim, dv = m->head_v_dim;
    const int C = 2 * nk * dk + nv * dv, r = nv / nk;
    norm_rows(e, L->attn_norm, n);
    int err = dense(e, &L->qkv, e->xn, n, e->p_qkv) | dense(e, &L->z, e->xn, n, e->p_z);
    if (L->alpha.data)
        err |= dense(e, &L->alpha, e->xn, n, e->p_alpha) | dense(e, &L->beta, e->xn, n, e->p_beta);
    else
        err |= dense(e, &L->ba, e->xn, n, e->p_alpha);
    if (err) return -1;
    run_jobs(e);
    for (int b = 0; b < n; b++) {
        float *co = e->conv_out + (size_t)b * C;
        fm_conv_update(seqs[b].conv[li], L->conv_w, e->p_qkv + (size_t)b * C, co, C, m->conv_kernel);
        for (int h = 0; h < nk; h++) {
            fm_l2norm_scale(co + (size_t)h * dk, dk, 1e-6f, 1.0f / sqrtf((float)dk));
            fm_l2norm_scale(co + (size_t)(nk + h) * dk, dk, 1e-6f, 1.0f);
        }
        float *decay = e->gates + (size_t)b * 2 * nv, *beta = decay + nv;
        for (int p = 0; p < nv; p++) {
            float a, bt;
            if (L->alpha.data) {
                a = e->p_alpha[(size_t)b * nv + p];
                bt = e->p_beta[(size_t)b * nv + p];
            } else {  // per key head: r beta rows then r alpha rows
                const float *ba = e->p_alpha + (size_t)b * 2 * nv + (size_t)(p / r) * 2 * r;
                bt = ba[p % r];
                a = ba[r + p % r];
            }
            decay[p] = expf(L->ssm_a[p] * fm_softplus(a + L->dt_bias[p]));
            beta[p] = fm_sigmoid(bt);
        }
    }
    layer_ctx c = { e, L, seqs, li };
    fm_pool_run(e->pool, gdn_task, &c, n * nv);
    if (dense(e, &L->ssm_out, e->core, n, e->attn_out)) return -1;
    run_jobs(e);
    add_rows(e->x, e->attn_out, n, m->hidden);
    return 0;
}

// ---- gated full attention layer

static void attn_task(void *arg, int task, int thread) {
    (void)thread;
    const layer_ctx *c = arg;
    fm_engine *e = c->e;
    const fm_model *m = e->m;
    const int nh = m->n_heads, hd = m->head_dim, nkv = m->n_kv_heads;
    const int b = task / nh, h = task % nh, kvh = h / (nh / nkv), T = c->seqs[b].pos + 1;
    const float *qg = e->p_qkv + (size_t)b * 2 * nh * hd + (size_t)h * 2 * hd;   // query then gate
    float *o = e->core + (size_t)b * nh * hd + (size_t)h * hd;
    const size_t stride = (size_t)nkv * hd;
    fm_attend(qg, c->seqs[b].k[c->li] + (size_t)kvh * hd, c->seqs[b].v[c->li] + (size_t)kvh * hd, T,
              (int)stride, hd, 1.0f / sqrtf((float)hd), e->scores + (size_t)task * (e->scores_cap / ((size_t)e->cap * nh)), o);
    for (int j = 0; j < hd; j++) o[j] *= fm_sigmoid(qg[hd + j]);
}

static void rope_table(fm_engine *e, int pos) {
    const int half = e->m->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        const double angle = pos * pow((double)e->m->rope_theta, -2.0 * i / e->m->rope_dim);
        e->rope[i] = (float)cos(angle);
        e->rope[half + i] = (float)sin(angle);
    }
}

static int full_layer(fm_engine *e, const fm_layer *L, int fi, int n, const fm_seq *seqs) {
    const fm_model *m = e->m;
    const int nh = m->n_heads, hd = m->head_dim, nkv = m->n_kv_heads;
    norm_rows(e, L->attn_norm, n);
    if (dense(e, &L->q, e->xn, n, e->p_qkv) | dense(e, &L->k, e->xn, n, e->p_k) | dense(e, &L->v, e->xn, n, e->p_v))
        return -1;
    run_jobs(e);
    int max_t = 0;
    for (int b = 0; b < n; b++) {
        rope_table(e, seqs[b].pos);
        for (int h = 0; h < nh; h++) {
            float *q = e->p_qkv + (size_t)b * 2 * nh * hd + (size_t)h * 2 * hd;
            fm_rmsnorm(q, L->q_norm, q, hd, m->rms_eps);
            fm_rope_neox(q, m->rope_dim, e->rope);
        }
        float *kc = seqs[b].k[fi] + (size_t)seqs[b].pos * nkv * hd, *vc = seqs[b].v[fi] + (size_t)seqs[b].pos * nkv * hd;
        for (int h = 0; h < nkv; h++) {
            fm_rmsnorm(e->p_k + ((size_t)b * nkv + h) * hd, L->k_norm, kc + (size_t)h * hd, hd, m->rms_eps);
            fm_rope_neox(kc + (size_t)h * hd, m->rope_dim, e->rope);
        }
        memcpy(vc, e->p_v + (size_t)b * nkv * hd, sizeof(float) * (size_t)nkv * hd);
        max_t = MAX(max_t, seqs[b].pos + 1);
    }
    const size_t need = (size_t)e->cap * nh * (size_t)max_t;
    if (need > e->scores_cap) {
        free(e->scores);
        e->scores_cap = MAX(need, 2 * e->scores_cap);
        e->scores_cap -= e->scores_cap % ((size_t)e->cap * nh);
        if (!(e->scores = malloc(sizeof(float) * e->scores_cap))) { e->scores_cap = 0; return -1; }
    }
    layer_ctx c = { e, L, seqs, fi };
    fm_pool_run(e->pool, attn_task, &c, n * nh);
    if (dense(e, &L->o, e->core, n, e->attn_out)) return -1;
    run_jobs(e);
    add_rows(e->x, e->attn_out, n, m->hidden);
    return 0;
}

// ---- MoE

static int moe(fm_engine *e, const fm_layer *L, int n) {
    const fm_model *m = e->m;
    const int H = m->hidden, E = m->n_experts, K = m->n_experts_used, K1 = K + 1;
    const int F = m->expert_ffn, Fs = m->shared_ffn, FW = MAX(F, Fs);
    const int shared = L->sh_gate.data != NULL;
    norm_rows(e, L->post_norm, n);
    if (dense(e, &L->router, e->xn, n, e->router)) return -1;
    run_jobs(e);
    for (int b = 0; b < n; b++) {
        fm_route(e->router + (size_t)b * E, E, K, e->probs, e->ids + (size_t)b * K1, e->wts + (size_t)b * K1);
        float s = 1.0f;
        if (L->sh_gate_inp) {
            const float *xb = e->xn + (size_t)b * H;
            double acc = 0.0;
            for (int i = 0; i < H; i++) acc += (double)L->sh_gate_inp[i] * xb[i];
            s = fm_sigmoid((float)acc);
        }
        e->sg[b] = s;
    }
    // phase 1: gate and up of every routed expert (its tokens together) and the shared expert
    const void **ag = quant_rows(e, L->gate_exps.type, e->xn, n, H, H);
    const void **au = quant_rows(e, L->up_exps.type, e->xn, n, H, H);
    const void **acts = arena_alloc(e, sizeof(void *) * (size_t)n * K1 * 2);
    float **outs = arena_alloc(e, sizeof(float *) * (size_t)n * K1 * 2);
    int *order = arena_alloc(e, sizeof(int) * (size_t)n * K1), *first = arena_alloc(e, sizeof(int) * (size_t)(E + 1));
    if (!ag || !au || !acts || !outs || !order || !first) return -1;
    memset(first, 0, sizeof(int) * (size_t)(E + 1));
    for (int i = 0; i < n; i++)
        for (int s = 0; s < K; s++) first[e->ids[(size_t)i * K1 + s] + 1]++;
    for (int x = 0; x < E; x++) first[x + 1] += first[x];
    int *fill = arena_alloc(e, sizeof(int) * (size_t)E);
    if (!fill) return -1;
    memcpy(fill, first, sizeof(int) * (size_t)E);
    for (int i = 0; i < n; i++)
        for (int s = 0; s < K; s++) order[fill[e->ids[(size_t)i * K1 + s]]++] = i * K1 + s;  // slot q = token*K1 + s
    const int nk_pairs = n * K;
    for (int x = 0; x < E; x++) {
        const int cnt = first[x + 1] - first[x];
        if (!cnt) continue;
        const void **a1 = acts + first[x], **a2 = acts + nk_pairs + first[x];
        float **o1 = outs + first[x], **o2 = outs + nk_pairs + first[x];
        for (int j = 0; j < cnt; j++) {
            const int q = order[first[x] + j];
            a1[j] = ag[q / K1];
            a2[j] = au[q / K1];
            o1[j] = e->g + (size_t)q * FW;
            o2[j] = e->u + (size_t)q * FW;
        }
        if (add_job(e, &L->gate_exps, x, cnt, a1, o1) || add_job(e, &L->up_exps, x, cnt, a2, o2)) return -1;
    }
    if (shared) {
        const size_t stride = (size_t)K1 * FW;
        if (add_job(e, &L->sh_gate, 0, n, quant_rows(e, L->sh_gate.type, e->xn, n, H, H), out_rows(e, e->g + (size_t)K * FW, n, stride)) ||
            add_job(e, &L->sh_up, 0, n, quant_rows(e, L->sh_up.type, e->xn, n, H, H), out_rows(e, e->u + (size_t)K * FW, n, stride)))
            return -1;
    }
    run_jobs(e);
    // phase 2: down projections of silu(g) * u
    for (int i = 0; i < n; i++)
        for (int s = 0; s < (shared ? K1 : K); s++) {
            float *g = e->g + ((size_t)i * K1 + s) * FW;
            const float *u = e->u + ((size_t)i * K1 + s) * FW;
            for (int j = 0; j < (s < K ? F : Fs); j++) g[j] = fm_silu(g[j]) * u[j];
        }
    const void **dacts = arena_alloc(e, sizeof(void *) * (size_t)n * K1);
    float **douts = arena_alloc(e, sizeof(float *) * (size_t)n * K1);
    const size_t dab = fm_act_bytes(L->down_exps.type, F);
    uint8_t *dbuf = arena_alloc(e, dab * (size_t)n * K);
    if (!dacts || !douts || !dbuf) return -1;
    for (int x = 0; x < E; x++) {
        const int cnt = first[x + 1] - first[x];
        if (!cnt) continue;
        for (int j = first[x]; j < first[x + 1]; j++) {
            const int q = order[j];
            fm_quantize_act(L->down_exps.type, e->g + (size_t)q * FW, F, dbuf + dab * j);
            dacts[j] = dbuf + dab * j;
            douts[j] = e->down + (size_t)q * H;
        }
        if (add_job(e, &L->down_exps, x, cnt, dacts + first[x], douts + first[x])) return -1;
    }
    if (shared && add_job(e, &L->sh_down, 0, n, quant_rows(e, L->sh_down.type, e->g + (size_t)K * FW, n, Fs, (size_t)K1 * FW),
                          out_rows(e, e->down + (size_t)K * H, n, (size_t)K1 * H)))
        return -1;
    run_jobs(e);
    for (int i = 0; i < n; i++) {
        float *x = e->x + (size_t)i * H;
        for (int s = 0; s < K; s++) {
            const float w = e->wts[(size_t)i * K1 + s], *d = e->down + ((size_t)i * K1 + s) * H;
            for (int j = 0; j < H; j++) x[j] += w * d[j];
        }
        if (shared) {
            const float *d = e->down + ((size_t)i * K1 + K) * H;
            for (int j = 0; j < H; j++) x[j] += e->sg[i] * d[j];
        }
    }
    return 0;
}

// ---- one decode step

int fm_decode(fm_engine *e, int n, const int *tokens, const fm_seq *seqs, float *logits) {
    const fm_model *m = e->m;
    if (reserve(e, n) != 0) return -1;
    e->bytes = 0.0;
    for (int b = 0; b < n; b++)
        fm_dequant_row(m->embd.type, (const uint8_t *)m->embd.data + (size_t)tokens[b] * m->embd.row_bytes,
                       e->x + (size_t)b * m->hidden, m->hidden);
    e->bytes += (double)n * m->embd.row_bytes;
    for (int i = 0; i < m->n_layers; i++) {
        const fm_layer *L = &m->layers[i];
        int err = L->is_full ? full_layer(e, L, e->full_index[i], n, seqs) : linear_layer(e, L, e->lin_index[i], n, seqs);
        if (err || moe(e, L, n)) return -1;
    }
    norm_rows(e, m->out_norm, n);
    if (dense(e, &m->output, e->xn, n, logits)) return -1;
    run_jobs(e);
    return 0;
}
