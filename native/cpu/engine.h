/* The native engine: one token for each of n sequences through every layer (decode), n tokens
 * of one sequence (prefill), or a few tokens of each of several sequences (a speculative verify),
 * in C; and the MTP block's draft step.
 * The model is described by pointers into the memory-mapped GGUF (weights in their stored
 * blocks) plus small fp32 vectors the caller dequantized once. */
#ifndef FERMIUM_ENGINE_H
#define FERMIUM_ENGINE_H

#include <stddef.h>
#include "fermium_cpu.h"

// ---- FM_CDEF begin
typedef struct {
    const void *data;          // NULL when absent
    int type;                  // GGML type id
    int rows, cols;            // one matrix: (rows, cols); an expert stack repeats it
    size_t row_bytes, mat_bytes;
} fm_weight;

typedef struct {
    int is_full;
    const float *attn_norm, *post_norm;   // (H,) stored 1+w
    // Gated DeltaNet
    fm_weight qkv, z, alpha, beta, ba, ssm_out;   // ba (qwen3next) when alpha.data is NULL
    const float *conv_w;       // (C, K)
    const float *ssm_a;        // (nv,) = -exp(A_log)
    const float *dt_bias;      // (nv,)
    const float *ssm_norm;     // (dv,)
    // gated full attention
    fm_weight q, k, v, o;
    const float *q_norm, *k_norm;   // (hd,)
    // MoE
    fm_weight router, gate_exps, up_exps, down_exps, sh_gate, sh_up, sh_down;
    const float *sh_gate_inp;  // (H,) or NULL: shared expert scaled by sigmoid(sh_gate_inp . x)
    // the dense FFN (qwen35)
    fm_weight ffn_gate, ffn_up, ffn_down;   // (F, H), (F, H), (H, F)
} fm_layer;

typedef struct {
    int hidden, vocab, n_layers;
    float rms_eps;
    int n_heads, n_kv_heads, head_dim, rope_dim;
    float rope_theta;
    // mRoPE: how many of the rope_dim / 2 frequencies follow T, H and W, interleaved (frequency j is H
    // when j % 3 == 1 and j < 3 sections[1], W when j % 3 == 2 and j < 3 sections[2], else T)
    int rope_sections[3];
    int conv_kernel, n_k_heads, n_v_heads, head_k_dim, head_v_dim, v_tiled;
    int n_experts, n_experts_used, expert_ffn, shared_ffn;   // all 0 in a dense model
    int ffn_kind;              // every layer's FFN: 0 the MoE, 1 the dense SwiGLU of dense_ffn (F)
    int dense_ffn;
    int kv_type;               // the KV cache's type: ggml id 0 f32, 1 f16, 8 q8_0
    fm_weight embd, output;
    const float *out_norm;     // (H,)
    const fm_layer *layers;    // (n_layers,)
    // the MTP block (fm_draft): its one full-attention layer is layers[0]; eh_proj.data NULL in a trunk
    fm_weight eh_proj;         // (H, 2H): [enorm(emb); hnorm(h)] -> the layer's input
    const float *enorm, *hnorm;   // (H,) stored 1+w
} fm_model;

typedef struct {
    int pos;                   // tokens already consumed; this token goes to position pos
    float *const *conv;        // per linear layer: (C, K-1)
    float *const *ssm;         // per linear layer: (nv, dk, dv)
    // per full layer: (>= pos+1, nkv, fm_kv_head_bytes(kv_type, hd) bytes); row pos is written
    void *const *k, *const *v;
    int rope_delta;            // a text row rotates at pos + rope_delta (images earlier hold it back)
    // NULL, or the row's (T, H, W) rotary positions (an image's rows, and the text of a prompt with
    // images); fm_prefill and fm_prefill_embd: (n, 3), row b's at mrope + 3 b
    const int *mrope;
} fm_seq;

typedef struct fm_engine fm_engine;
// NULL when out of memory, or for a kv_type that the head size cannot be kept in
fm_engine *fm_engine_new(const fm_model *model, fm_pool *pool);
void fm_engine_free(fm_engine *engine);
// logits: (n, vocab); returns 0, or -1 when out of memory
int fm_decode(fm_engine *engine, int n, const int *tokens, const fm_seq *seqs, float *logits);
// prefill: n tokens of one sequence, in order, from position seq->pos (its KV buffers have rows
// up to pos + n - 1); logits: (logit_rows, vocab), those of the last logit_rows tokens (0..n).
// Each weight is read once for all n tokens. Returns 0, or -1 (bad arguments, out of memory)
int fm_prefill(fm_engine *engine, int n, const int *tokens, const fm_seq *seq, int logit_rows, float *logits);
// fm_prefill whose rows embd_rows[0..n_embd-1] (in [0, n)) take embd (n_embd, hidden) in place of their
// tokens' embeddings: an image's rows from the vision encoder
int fm_prefill_embd(fm_engine *engine, int n, const int *tokens, const fm_seq *seq, int n_embd, const int *embd_rows,
                    const float *embd, int logit_rows, float *logits);
// verify: n_runs sequences of run_rows[r] tokens each, run after run in tokens and rows (one fm_seq per
// row). A run's row j goes to position rows[j].pos = rows[0].pos + j and shares row 0's KV buffers;
// row 0 updates its recurrent state in place, row j > 0 first copies row j-1's conv and ssm into its
// own buffers (where they differ) and updates those; a run's rows attend together, reading its cache
// once. logits: (n, vocab); hidden: NULL or (n, hidden), each row's hidden after output_norm.
// Each weight is read once for all n rows. Returns 0, or -1 (bad arguments, out of memory)
int fm_verify(fm_engine *engine, int n_runs, const int *run_rows, const int *tokens, const fm_seq *rows,
              float *logits, float *hidden);
// the MTP block over n rows (an engine whose model has eh_proj): row b is (tokens[b], hidden[b]) at its
// fm_seq's pos in that row's KV (the block's own: k[0], v[0]); a sequence's rows consecutive, in order.
// out_rows: NULL, or the n_out rows (ascending) whose output is wanted: the others only fill the KV, so
// the MoE and the head skip them. logits: (n_out, vocab of that model); hidden_out: NULL or (n_out,
// hidden), those rows after the final norm. Returns 0, or -1 (bad arguments, out of memory)
int fm_draft(fm_engine *engine, int n, const int *tokens, const float *hidden, const fm_seq *seqs, int n_out,
             const int *out_rows, float *logits, float *hidden_out);
double fm_engine_bytes(const fm_engine *engine);   // weight bytes read by the last step
// the last step's phases (fm_decode, fm_prefill, fm_verify or fm_draft): (seconds, bytes) for the
// matvecs of the mixer inputs, the mixer heads (DeltaNet recurrence and attention; bytes of state and
// cache read and written), the matvecs of the mixer output, router, expert gate/up, expert down, LM
// head, then the work around the mixer heads and around the MoE matvecs (no bytes); then the whole
// step's seconds (2 * fm_engine_phase_count() + 1 doubles)
void fm_engine_phases(const fm_engine *engine, double *out);
int fm_engine_phase_count(void);
// ---- FM_CDEF end

#endif
