/* The native engine: one token for each of n sequences through every layer (decode), n tokens
 * of one sequence (prefill), or a few tokens of each of several sequences (a speculative verify),
 * in C; and the MTP block's draft step.
 * The model is described by pointers into the memory-mapped GGUF (weights in their stored
 * blocks) plus small fp32 vectors the caller dequantized once. */
#ifndef FERMIUM_ENGINE_H
#define FERMIUM_ENGINE_H

#include "engine_types.h"
#include "fermium_cpu.h"

// ---- FM_CDEF begin
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
