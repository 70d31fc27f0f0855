/* The dense FFN of qwen35 for n tokens: x += down(silu(gate xn) * up xn), xn the post-attention
 * norm of x. The same matvec jobs as the MoE's shared expert, for every token; its phases are
 * timed as the experts' (gate/up, down). */
#include "engine_impl.h"
#include "ops.h"

typedef struct {
    fm_engine *e;
    int F, down_type;
    uint8_t *dbuf;         // (n, dab): the down inputs, quantized
    size_t dab;
} dense_ctx;

// token b: g = silu(g) * u, then quantized for the down matrix
static void act_task(void *arg, int b, int thread) {
    (void)thread;
    const dense_ctx *c = arg;
    float *g = c->e->g + (size_t)b * c->F;
    fm_silu_mul(g, c->e->u + (size_t)b * c->F, c->F);
    fm_quantize_act(c->down_type, g, c->F, c->dbuf + c->dab * b);
}

int eng_dense_ffn(fm_engine *e, const fm_layer *L, int n) {
    const int H = e->m->hidden, F = e->m->dense_ffn;
    eng_norm_rows(e, L->post_norm, n);
    const void **ag = eng_quant_rows(e, L->ffn_gate.type, e->xn, n, H, H);
    if (eng_add_job(e, &L->ffn_gate, 0, n, ag, eng_out_rows(e, e->g, n, (size_t)F))) return -1;
    const void **au = eng_quant_rows(e, L->ffn_up.type, e->xn, n, H, H);   // ag again when the formats agree
    if (eng_add_job(e, &L->ffn_up, 0, n, au, eng_out_rows(e, e->u, n, (size_t)F))) return -1;
    eng_run_jobs(e, PH_EXPERT_UP);
    const double t0 = eng_seconds();
    const size_t dab = fm_act_bytes(L->ffn_down.type, F);
    uint8_t *dbuf = eng_arena_alloc(e, dab * (size_t)n);
    const void **dacts = eng_arena_alloc(e, sizeof(void *) * (size_t)n);
    if (!dbuf || !dacts) return -1;
    dense_ctx c = { e, F, L->ffn_down.type, dbuf, dab };
    fm_pool_run(e->pool, act_task, &c, n);
    for (int b = 0; b < n; b++) dacts[b] = dbuf + dab * b;
    eng_phase_since(e, PH_MOE_PREP, t0);
    if (eng_add_job(e, &L->ffn_down, 0, n, dacts, eng_out_rows(e, e->down, n, (size_t)H))) return -1;
    eng_run_jobs(e, PH_EXPERT_DOWN);
    eng_add_rows(e->x, e->down, n, H);
    return 0;
}
