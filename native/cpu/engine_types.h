/* The types of the engine's interface (engine.h): a weight matrix in its stored blocks, a layer,
 * the model, one sequence's row of a step, and the engine's handle. Types only, so that the
 * layer files (engine_impl.h) take them without taking the engine's functions. */
#ifndef FERMIUM_ENGINE_TYPES_H
#define FERMIUM_ENGINE_TYPES_H

#include <stddef.h>

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
// ---- FM_CDEF end

#endif
