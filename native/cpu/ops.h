/* fp32 ops of one decode step (norms, conv update, Gated DeltaNet, RoPE, attention, routing).
 * Plain C loops shaped for the compiler's vectorizer; not the weight-streaming kernels. */
#ifndef FERMIUM_OPS_H
#define FERMIUM_OPS_H

#include "activations.h"

// y = x / rms(x) * w ; y may alias x
void fm_rmsnorm(const float *x, const float *w, float *y, int n, float eps);
// x *= 1 / sqrt(sum x^2 + eps) * scale
void fm_l2norm_scale(float *x, int n, float eps, float scale);
// elementwise, vectorized: g = silu(g) * u ; o *= silu(z) ; o *= sigmoid(g)
void fm_silu_mul(float *g, const float *u, int n);
void fm_mul_silu(float *o, const float *z, int n);
void fm_mul_sigmoid(float *o, const float *g, int n);
// causal depthwise conv over [state | x] then SiLU; state (C, K-1) shifts in x; through the
// active ISA's sibling (conv_body.h; state, w, x and out must not overlap)
#define FM_CONV_ARGS float *state, const float *w, const float *x, float *out, int C, int K
void fm_conv_update(FM_CONV_ARGS);
void fm_conv_update_generic(FM_CONV_ARGS);
void fm_conv_update_ssse3(FM_CONV_ARGS);
void fm_conv_update_avx2(FM_CONV_ARGS);
typedef void (*fm_conv_fn)(FM_CONV_ARGS);
// one Gated DeltaNet value head: the state S0 (dk, dv) decays, takes the delta rule and lands in
// S (S0 itself, or another buffer, as a verify row's rollback slot), o = S^T q; through the active
// ISA's sibling (gdn_body.h). stream: S is written with non-temporal stores (a state that nothing
// reads again this step), where it is aligned to the vector width
#define FM_GDN_ARGS const float *S0, float *S, const float *q, const float *k, const float *v, float decay, \
                    float beta, float *o, int dk, int dv, int stream
void fm_gdn_head(FM_GDN_ARGS);
void fm_gdn_head_generic(FM_GDN_ARGS);
void fm_gdn_head_ssse3(FM_GDN_ARGS);
void fm_gdn_head_avx2(FM_GDN_ARGS);
typedef void (*fm_gdn_fn)(FM_GDN_ARGS);
// NeoX rotate-half on the first rope_dim dims; cs: (rope_dim/2) cos then (rope_dim/2) sin
void fm_rope_neox(float *x, int rope_dim, const float *cs);
// causal attention of the query heads of one KV group over a prefill chunk (or a decode step's
// one token): tokens i < nq at positions pos0 + i, heads g < group, q[i * q_tok + g * q_head + d];
// key and value t, for key0 <= t < key1 and t <= pos0 + i, in the cache type kv_type (FM_KV_*)
// at byte offset t * kv_stride of k and v; o[i * o_tok + g * o_head + d] = softmax_t(scale q.k_t) v_t,
// or with ml: o unnormalised (sum_t e^(s_t - m) v_t) and ml[2 r] = m, ml[2 r + 1] = sum_t e^(s_t - m)
// for row r = i * group + g, the part of one split of the keys (fm_attn_decode merges them).
// Blocks of FM_ATTN_ROWS (token, head) rows times FM_ATTN_KEYS keys with an online softmax, so
// each block of K and V is read (and converted to f32) once for all the group's heads. Through
// the active ISA's sibling; work: fm_attn_tiled_work(group, hd) floats
#define FM_ATTN_ROWS 64
#define FM_ATTN_KEYS 64
#define FM_ATTN_ARGS const float *q, size_t q_tok, size_t q_head, const void *k, const void *v, size_t kv_stride, \
                     int kv_type, float *o, size_t o_tok, size_t o_head, int nq, int pos0, int key0, int key1, \
                     int group, int hd, float scale, float *work, float *ml
#define FM_ATTN_PASS q, q_tok, q_head, k, v, kv_stride, kv_type, o, o_tok, o_head, nq, pos0, key0, key1, group, hd, \
                     scale, work, ml
void fm_attn_tiled(FM_ATTN_ARGS);
void fm_attn_tiled_generic(FM_ATTN_ARGS);
void fm_attn_tiled_ssse3(FM_ATTN_ARGS);
void fm_attn_tiled_avx2(FM_ATTN_ARGS);
void fm_attn_tiled_avx512(FM_ATTN_ARGS);
typedef void (*fm_attn_fn)(FM_ATTN_ARGS);
fm_attn_fn fm_attn_for(int isa);   // ISA isa's sibling (-1: the active one); NULL where unsupported
// the KV cache types: their ggml type ids (kv_cache_generic.c converts them: fermium_cpu.h)
#define FM_KV_F32 0
#define FM_KV_F16 1
#define FM_KV_Q8_0 8
// softmax over E logits, top-k, renormalise the k kept weights
void fm_route(const float *logits, int E, int k, float *probs, int *ids, float *w);

#endif
