/* The C interface of native/cpu: ISA dispatch, activation quantizers, the thread pool, the
 * matvec driver, the fp32 decode ops and the decode engine. cffi sees the FM_CDEF section. */
#ifndef FERMIUM_CPU_H
#define FERMIUM_CPU_H

#include <stddef.h>
#include <stdint.h>

// ---- FM_CDEF begin
typedef struct fm_pool fm_pool;
// dispatch: 0 generic, 1 ssse3, 2 avx2, 3 avx512
int fm_isa_supported(int isa);
int fm_isa_best(void);
int fm_isa_select(int isa);           // 0 ok, -1 unsupported here
int fm_isa_active(void);
const char *fm_isa_name(int isa);

// per weight type: values per block, bytes per block (and row), rows interleaved in its layout,
// activation bytes for n values
int fm_type_supported(int type);
int fm_type_block(int type);
int fm_type_block_bytes(int type);
int fm_type_group(int type);
size_t fm_act_bytes(int type, int n);
void fm_quantize_act(int type, const float *x, int n, void *act);
float fm_vec_dot(int isa, int type, int n, const void *w, const void *act);
void fm_dequant_row(int type, const void *w, float *out, int n);

// weights repacked for SIMD (quants.h), the same size as the source, as types of their own:
// Q4_0 and Q4_K in groups of 8 rows (0x100 | the GGUF type), Q6_K row by row, and Q4_0 and Q4_K
// row by row for 128-bit registers (0x200 | the GGUF type)
#define FM_Q4_0X8 258
#define FM_Q4_KX8 268
#define FM_Q6_KP 270
#define FM_Q4_0P 514
#define FM_Q4_KP 524
// the GGUF type whose bytes `layout` holds; -1 for a type that is no repacked layout
int fm_repack_source(int layout);
// rows of that GGUF type -> the same bytes in `layout`; -1 for no repacked layout, or rows that
// are no whole number of its groups of rows, or cols of its blocks
int fm_repack(int layout, const void *src, size_t rows, int cols, void *dst);
// one group of repacked rows . na (1..4) activations: out[i * group + r]; -1 for a type
// stored row by row (group 1)
int fm_vec_dot_group(int isa, int type, int n, const void *w, const void *const *acts, int na, float *out);
// nr (1..FM_DOTR_MAX) consecutive rows, row_bytes apart, . na (1..4) activations through ISA
// `isa`'s kernel for several rows at once: out[i * FM_DOTR_MAX + r]; -1 where it has none for
// the type (fm_has_dot_rows: 0)
#define FM_DOTR_MAX 2
int fm_has_dot_rows(int isa, int type);
int fm_vec_dot_rows(int isa, int type, int n, const void *w, size_t row_bytes, int nr, const void *const *acts,
                    int na, float *out);
// one Gated DeltaNet value head through ISA `isa`'s kernel: S (dk, dv) decays and takes the
// delta rule with key k, value v; o = S^T q. -1 where the ISA is not on this CPU
int fm_gdn_head_isa(int isa, float *S, const float *q, const float *k, const float *v, float decay, float beta,
                    float *o, int dk, int dv);
// the same from the state S0 into S (S0 itself, or another buffer); stream: S written with
// non-temporal stores where it is aligned to the ISA's vectors
int fm_gdn_head_to_isa(int isa, const float *S0, float *S, const float *q, const float *k, const float *v,
                       float decay, float beta, float *o, int dk, int dv, int stream);
// the conv update of C channels (kernel K) through ISA `isa`'s sibling: out = SiLU of the taps
// over [state | x], and state (C, K-1) shifts in x. -1 where the ISA is not on this CPU
int fm_conv_update_isa(int isa, float *state, const float *w, const float *x, float *out, int C, int K);
// causal attention of one KV group's query heads through ISA `isa`'s kernel (ops.h:
// fm_attn_tiled: keys key0 <= t < key1 in cache type kv_type, kv_stride bytes apart; ml NULL, or
// the unnormalised part of a split); -1 where the ISA is not on this CPU. fm_attn_block_tokens:
// the query tokens of one block for `group` heads (the engine's task size); fm_attn_tiled_work:
// the floats of work
int fm_attn_tiled_isa(int isa, const float *q, size_t q_tok, size_t q_head, const void *k, const void *v,
                      size_t kv_stride, int kv_type, float *o, size_t o_tok, size_t o_head, int nq, int pos0,
                      int key0, int key1, int group, int hd, float scale, float *work, float *ml);
int fm_attn_block_tokens(int group);
size_t fm_attn_tiled_work(int group, int hd);
// decode attention of n sequences, one query token each at position pos[b], over the pool:
// sequence b's keys and values 0..pos[b] from k[b] and v[b] (head h at byte h * fm_kv_head_bytes,
// positions kv_stride bytes apart), its queries q + b * q_seq + (h * group + g) * q_head, its output
// o + b * o_seq + (h * group + g) * o_head. A long sequence's keys are split across tasks whose
// partial softmaxes are merged (flash-decoding); splits: per KV head, 0 to choose from the length
// and the pool's threads. ISA `isa`'s kernel (-1: the active one); work: fm_attn_decode_work
// floats. Returns 0, or -1 where the ISA is not on this CPU
size_t fm_attn_decode_work(int threads, int n, const int *pos, int nkv, int group, int hd, int splits);
int fm_attn_decode(fm_pool *pool, int isa, int n, const int *pos, const float *q, size_t q_seq, size_t q_head,
                   const void *const *k, const void *const *v, size_t kv_stride, int kv_type, float *o,
                   size_t o_seq, size_t o_head, int nkv, int group, int hd, float scale, int splits, float *work);
// the KV cache types (ggml ids: 0 f32, 1 f16, 8 q8_0): bytes of one head of one position (0 for a
// type or hd that cannot be), and n values (a multiple of 32 for q8_0) to and from the type
size_t fm_kv_head_bytes(int kv_type, int hd);
void fm_kv_store(int kv_type, const float *x, void *dst, int n);
void fm_kv_load(int kv_type, const void *src, float *x, int n);
// a 64-bit checksum of `bytes` bytes, at about memory speed
uint64_t fm_checksum(const void *data, size_t bytes);

// thread pool
fm_pool *fm_pool_new(int n_threads);
void fm_pool_free(fm_pool *pool);
int fm_pool_threads(const fm_pool *pool);
// the pool checked: `jobs` jobs of 1..max_tasks tasks in turn, each task counting its runs;
// returns how many tasks had not run exactly once when their job returned (0: sound)
long fm_pool_check(fm_pool *pool, int jobs, int max_tasks);

// y[b, rows] = W[rows, cols] . x[b, cols] for b < n (each weight row read once for all n)
void fm_matvec(fm_pool *pool, int type, const void *w, size_t row_bytes, int rows, int cols,
               int n, const float *x, float *y);

// streaming read bandwidth over a buffer kept between measurements (allocated in 2 MiB pages
// where the kernel gives them, and touched once); NULL when `bytes` holds no 2 MiB or cannot be
// allocated. fm_membw_run: bytes/s, the best of `reps` times two streams (plain loads, and loads
// with software prefetch)
typedef struct fm_membw_buf fm_membw_buf;
fm_membw_buf *fm_membw_new(fm_pool *pool, size_t bytes);
double fm_membw_run(fm_pool *pool, fm_membw_buf *b, int reps);
// one stream over the buffer: plain loads, or (prefetch != 0) with the kernels' software prefetch
double fm_membw_stream(fm_pool *pool, fm_membw_buf *b, int prefetch);
void fm_membw_free(fm_membw_buf *b);
// ---- FM_CDEF end

// fm_membw_run on a buffer of `bytes` made and freed for the call; -1 where it cannot be
// allocated (C callers: tools/ab_matvec.c)
double fm_membw(fm_pool *pool, size_t bytes, int reps);

#endif
