/* The decode engine's state and the helpers its layer files share (engine_jobs.c defines them;
 * engine.c, mixers.c, moe.c, dense_ffn.c and attn_runs.c use them).
 * Internal to native/cpu. */
#ifndef FERMIUM_ENGINE_IMPL_H
#define FERMIUM_ENGINE_IMPL_H

#include "engine_types.h"
#include "internal.h"

#define MAX(a, b) ((a) > (b) ? (a) : (b))

// the phases of a step, timed separately (fm_engine_phases): the matvecs, the mixer heads, and
// the stretches around them: the mixers' (conv update and q/k norms as pool tasks; for attention
// the q/k norms, RoPE and the KV append) and the MoE's (routing; SiLU and the down inputs'
// quantization, then the weighted sum of the experts, as pool tasks). The rest of the step is
// serial: norms, the quantization of the matvec inputs, the embedding row.
enum { PH_MIX_IN, PH_HEADS, PH_MIX_OUT, PH_ROUTER, PH_EXPERT_UP, PH_EXPERT_DOWN, PH_HEAD,
       PH_MIX_PREP, PH_MOE_PREP, PH_COUNT };

// the last rows eng_quant_rows prepared: asked again for the same rows in the same activation
// format within a phase (qkv and z, gate and up), it hands them back instead of redoing them
typedef struct {
    const float *x;
    int act, n, cols;
    size_t stride;
    const void **rows;            // NULL: nothing to reuse
} quant_memo;

typedef int (*eng_ffn_fn)(fm_engine *e, const fm_layer *L, int n);

struct fm_engine {
    const fm_model *m;
    fm_pool *pool;
    eng_ffn_fn ffn;               // the model's FFN kind: eng_moe or eng_dense_ffn
    int cap;                      // batch capacity of the scratch below
    int chain;                    // 1 in a prefill: the rows are one sequence's tokens, in order
    int n_runs;                   // in a verify: the sequences, each run_first[r]..run_first[r+1]-1 of the rows
    const int *run_first;         // (n_runs + 1,), or NULL outside a verify
    int n_out;                    // in a draft: the rows the last layer's MoE and the head run for
    const int *out_rows;          // (n_out,) ascending, or NULL: every row
    int *lin_index, *full_index;  // (n_layers,) position among linear / full layers, or -1
    // scratch, each (cap, ...)
    float *x, *xn;                // (cap, H)
    float *cat;                   // (cap, 2H) when the model has eh_proj: the MTP block's input
    float *p_qkv, *p_z, *p_alpha, *p_beta, *p_k, *p_v;
    float *conv_out, *core, *attn_out;
    float *router, *probs, *rope;
    int *ids;
    float *wts, *sg, *g, *u, *down;   // g, u: (cap*(K+1), maxF); down: (cap*(K+1), H)
    float *scores;                // attention work (fm_attn_tiled_work), scores_cap / threads per pool thread
    size_t scores_cap;
    uint8_t *arena;               // activations and pointer lists of the current phase
    size_t arena_size, arena_used;
    fm_mv_job *jobs;
    int n_jobs, max_jobs;
    quant_memo memo;
    double bytes;
    double phase_s[PH_COUNT], phase_bytes[PH_COUNT], step_s;   // the last step
};

// the runs of a step, each a sequence whose rows go in order: one per row in a decode step, the
// whole chunk in a prefill, the verify's runs
static inline int eng_runs(const fm_engine *e, int n) { return e->chain ? 1 : e->run_first ? e->n_runs : n; }
static inline void eng_run_span(const fm_engine *e, int n, int r, int *b0, int *b1) {
    if (e->chain) { *b0 = 0; *b1 = n; }
    else if (e->run_first) { *b0 = e->run_first[r]; *b1 = e->run_first[r + 1]; }
    else { *b0 = r; *b1 = r + 1; }
}

// ---- engine.c: scratch and matvec jobs
void *eng_arena_alloc(fm_engine *e, size_t bytes);
// n rows of x (stride floats apart) quantized for weights of `type`; NULL when out of arena
const void **eng_quant_rows(fm_engine *e, int type, const float *x, int n, int cols, size_t stride);
float **eng_out_rows(fm_engine *e, float *base, int n, size_t stride);
int eng_add_job(fm_engine *e, const fm_weight *w, int mat, int n, const void **acts, float **outs);
// y[b, :rows] = W x[b] for all n tokens, x rows `cols` apart, y rows `rows` apart
int eng_dense(fm_engine *e, const fm_weight *w, const float *x, int n, float *y);
void eng_run_jobs(fm_engine *e, int phase);   // phase: PH_*, for the timing
double eng_seconds(void);                     // a monotonic clock
// adds the time since t0 (eng_seconds) to a phase
void eng_phase_since(fm_engine *e, int phase, double t0);
void eng_add_rows(float *x, const float *y, int n, int H);
// every phase starts from the norm of the residual: it also recycles the arena
void eng_norm_rows(fm_engine *e, const float *w, int n);

// ---- attn_runs.c: a verify's attention, runs of one sequence's consecutive query rows over the pool
typedef struct {
    int n_runs;
    const int *first;             // (n_runs + 1,): run r is rows first[r] .. first[r+1]-1
    const int *pos0;              // (n_runs,): the position of each run's first row
    const float *q;               // row i's query head h at q + i * q_tok + h * q_head
    size_t q_tok, q_head;
    const void *const *k, *const *v;   // (n_runs,): each run's cache, positions kv_stride bytes apart
    size_t kv_stride;
    int kv_type;
    float *o;                     // row i's head h at o + i * o_tok + h * o_head
    size_t o_tok, o_head;
    int nkv, group, hd;
    float scale;
    float *work;                  // eng_attn_runs_work floats
    float *part;                  // set by eng_attn_runs: the splits' parts, inside work
} eng_attn_runs_args;
size_t eng_attn_runs_work(const eng_attn_runs_args *a, int threads);
int eng_attn_runs(fm_pool *pool, eng_attn_runs_args *a);   // 0, or -1 where the ISA has no kernel

// ---- mixers.c, moe.c and dense_ffn.c: one layer's parts for n tokens; 0 or -1 (out of scratch)
int eng_linear_layer(fm_engine *e, const fm_layer *L, int li, int n, const fm_seq *seqs);
int eng_full_layer(fm_engine *e, const fm_layer *L, int fi, int n, const fm_seq *seqs);
int eng_moe(fm_engine *e, const fm_layer *L, int n);
int eng_dense_ffn(fm_engine *e, const fm_layer *L, int n);

#endif
