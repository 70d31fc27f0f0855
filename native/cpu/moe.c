/* The MoE block of one decode step: route each token (softmax, top-k, renormalise), run
 * every routed expert once for all the tokens routed to it, plus the gated shared expert. */
#include <math.h>
#include <string.h>
#include "engine_impl.h"
#include "ops.h"

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
    eng_phase_since(e, PH_MOE_SERIAL, t0);
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
    for (int i = 0; i < n; i++)
        for (int s = 0; s < (shared ? K1 : K); s++) {
            float *g = e->g + ((size_t)i * K1 + s) * FW;
            const float *u = e->u + ((size_t)i * K1 + s) * FW;
            fm_silu_mul(g, u, s < K ? F : Fs);
        }
    const void **dacts = eng_arena_alloc(e, sizeof(void *) * (size_t)n * K1);
    float **douts = eng_arena_alloc(e, sizeof(float *) * (size_t)n * K1);
    const size_t dab = fm_act_bytes(L->down_exps.type, F);
    uint8_t *dbuf = eng_arena_alloc(e, dab * (size_t)n * K);
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
        if (eng_add_job(e, &L->down_exps, x, cnt, dacts + first[x], douts + first[x])) return -1;
    }
    eng_phase_since(e, PH_MOE_SERIAL, t0);
    if (shared && eng_add_job(e, &L->sh_down, 0, n, eng_quant_rows(e, L->sh_down.type, e->g + (size_t)K * FW, n, Fs, (size_t)K1 * FW),
                          eng_out_rows(e, e->down + (size_t)K * H, n, (size_t)K1 * H)))
        return -1;
    eng_run_jobs(e, PH_EXPERT_DOWN);
    t0 = eng_seconds();
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
    eng_phase_since(e, PH_MOE_SERIAL, t0);
    return 0;
}
