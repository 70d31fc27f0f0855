/* The MoE block of one decode step: route each token (softmax, top-k, renormalise), run
 * every routed expert once for all the tokens routed to it, plus the gated shared expert. */
#include <math.h>
#include <string.h>
#include "engine_impl.h"
#include "ops.h"

typedef struct {
    fm_engine *e;
    int n, F, Fs, FW, shared, down_type;
    const int *order;      // (n * K,) routed slots q = token * (K+1) + s, grouped by expert
    uint8_t *dbuf;         // the routed slots' down inputs, quantized, in that order
    size_t dab;
} moe_ctx;

// silu(g) * u of one slot, and for a routed slot its down input quantized: tasks 0..nK-1 the
// routed slots in expert order, then one per token for the shared expert
static void act_task(void *arg, int task, int thread) {
    (void)thread;
    const moe_ctx *c = arg;
    const fm_engine *e = c->e;
    const int K = e->m->n_experts_used, K1 = K + 1, nk = c->n * K;
    const int q = task < nk ? c->order[task] : (task - nk) * K1 + K;
    float *g = e->g + (size_t)q * c->FW;
    fm_silu_mul(g, e->u + (size_t)q * c->FW, task < nk ? c->F : c->Fs);
    if (task < nk) fm_quantize_act(c->down_type, g, c->F, c->dbuf + c->dab * task);
}

#define SUM_TASKS 4   // per token: the hidden width in parts

// x += the routing-weighted expert outputs and the gated shared expert's, over one part of x
static void sum_task(void *arg, int task, int thread) {
    (void)thread;
    const moe_ctx *c = arg;
    const fm_engine *e = c->e;
    const int H = e->m->hidden, K = e->m->n_experts_used, K1 = K + 1;
    const int i = task / SUM_TASKS, part = task % SUM_TASKS;
    const int j0 = H * part / SUM_TASKS, j1 = H * (part + 1) / SUM_TASKS;
    float *x = e->x + (size_t)i * H;
    for (int s = 0; s < (c->shared ? K1 : K); s++) {
        const float w = s < K ? e->wts[(size_t)i * K1 + s] : e->sg[i], *d = e->down + ((size_t)i * K1 + s) * H;
        for (int j = j0; j < j1; j++) x[j] += w * d[j];
    }
}

int eng_moe(fm_engine *e, const fm_layer *L, int n) {
    const fm_model *m = e->m;
    const int H = m->hidden, E = m->n_experts, K = m->n_experts_used, K1 = K + 1;
    const int F = m->expert_ffn, Fs = m->shared_ffn, FW = MAX(F, Fs);
    const int shared = L->sh_gate.data != NULL;
    eng_norm_rows(e, L->post_norm, n);
    if (eng_dense(e, &L->router, e->xn, n, e->router)) return -1;
    eng_run_jobs(e, PH_ROUTER);
    double t0 = eng_seconds();
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
    eng_phase_since(e, PH_MOE_PREP, t0);
    // phase 1: gate and up of every routed expert (its tokens together) and the shared expert
    const void **ag = eng_quant_rows(e, L->gate_exps.type, e->xn, n, H, H);
    const void **au = eng_quant_rows(e, L->up_exps.type, e->xn, n, H, H);
    const void **acts = eng_arena_alloc(e, sizeof(void *) * (size_t)n * K1 * 2);
    float **outs = eng_arena_alloc(e, sizeof(float *) * (size_t)n * K1 * 2);
    int *order = eng_arena_alloc(e, sizeof(int) * (size_t)n * K1), *first = eng_arena_alloc(e, sizeof(int) * (size_t)(E + 1));
    if (!ag || !au || !acts || !outs || !order || !first) return -1;
    memset(first, 0, sizeof(int) * (size_t)(E + 1));
    for (int i = 0; i < n; i++)
        for (int s = 0; s < K; s++) first[e->ids[(size_t)i * K1 + s] + 1]++;
    for (int x = 0; x < E; x++) first[x + 1] += first[x];
    int *fill = eng_arena_alloc(e, sizeof(int) * (size_t)E);
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
        if (eng_add_job(e, &L->gate_exps, x, cnt, a1, o1) || eng_add_job(e, &L->up_exps, x, cnt, a2, o2)) return -1;
    }
    if (shared) {
        const size_t stride = (size_t)K1 * FW;
        if (eng_add_job(e, &L->sh_gate, 0, n, eng_quant_rows(e, L->sh_gate.type, e->xn, n, H, H), eng_out_rows(e, e->g + (size_t)K * FW, n, stride)) ||
            eng_add_job(e, &L->sh_up, 0, n, eng_quant_rows(e, L->sh_up.type, e->xn, n, H, H), eng_out_rows(e, e->u + (size_t)K * FW, n, stride)))
            return -1;
    }
    eng_run_jobs(e, PH_EXPERT_UP);
    // phase 2: down projections of silu(g) * u
    t0 = eng_seconds();
    const size_t dab = fm_act_bytes(L->down_exps.type, F);
    const void **dacts = eng_arena_alloc(e, sizeof(void *) * (size_t)n * K1);
    float **douts = eng_arena_alloc(e, sizeof(float *) * (size_t)n * K1);
    uint8_t *dbuf = eng_arena_alloc(e, dab * (size_t)n * K);
    if (!dacts || !douts || !dbuf) return -1;
    moe_ctx c = { e, n, F, Fs, FW, shared, L->down_exps.type, order, dbuf, dab };
    fm_pool_run(e->pool, act_task, &c, n * K + (shared ? n : 0));
    for (int x = 0; x < E; x++) {
        const int cnt = first[x + 1] - first[x];
        if (!cnt) continue;
        for (int j = first[x]; j < first[x + 1]; j++) {
            dacts[j] = dbuf + dab * j;
            douts[j] = e->down + (size_t)order[j] * H;
        }
        if (eng_add_job(e, &L->down_exps, x, cnt, dacts + first[x], douts + first[x])) return -1;
    }
    eng_phase_since(e, PH_MOE_PREP, t0);
    if (shared && eng_add_job(e, &L->sh_down, 0, n, eng_quant_rows(e, L->sh_down.type, e->g + (size_t)K * FW, n, Fs, (size_t)K1 * FW),
                          eng_out_rows(e, e->down + (size_t)K * H, n, (size_t)K1 * H)))
        return -1;
    eng_run_jobs(e, PH_EXPERT_DOWN);
    t0 = eng_seconds();
    fm_pool_run(e->pool, sum_task, &c, n * SUM_TASKS);
    eng_phase_since(e, PH_MOE_PREP, t0);
    return 0;
}
