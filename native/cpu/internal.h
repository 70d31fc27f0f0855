/* Declarations shared between the C files of native/cpu and not exported to Python. */
#ifndef FERMIUM_INTERNAL_H
#define FERMIUM_INTERNAL_H

#include "quants.h"
#include "fermium_cpu.h"
#include <emmintrin.h>

// MXCSR flush-to-zero: the fp32 ops of a step (SiLU, the conv, the recurrent state) otherwise
// produce subnormal values now and then, and each costs a microcode assist. Results below
// 1.2e-38 do not matter to a decode. Set for the engine's step and for every pool job (the
// workers keep it; a caller gets its own mode back afterwards). Not denormals-are-zero: inputs
// stay exact, and the SSSE3 kernels scale a subnormal f16 block scale as a subnormal float
// (qx_0_row_ssse3.c), which DAZ would read as zero.
#define FM_MXCSR_FTZ 0x8000u
static inline unsigned fm_flush_denormals(void) {
    const unsigned old = _mm_getcsr();
    _mm_setcsr(old | FM_MXCSR_FTZ);
    return old;
}

// the sum of `bytes` (a multiple of 64) from 16-byte-aligned p, one cache line per step into
// four independent 128-bit sums, so that the loop is never the limit; with `prefetch`, each line
// requested ahead as the kernels request their weights: the read bandwidth that the kernels are
// measured against (membw.c, selftest/stream.c)
static inline uint64_t fm_stream_sum(const void *p, size_t bytes, int prefetch) {
    const __m128i *v = p;
    __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 4 <= bytes / 16; i += 4) {
        if (prefetch) fm_prefetch_ahead(v + i, 64);
        s0 = _mm_add_epi64(s0, _mm_load_si128(v + i));
        s1 = _mm_add_epi64(s1, _mm_load_si128(v + i + 1));
        s2 = _mm_add_epi64(s2, _mm_load_si128(v + i + 2));
        s3 = _mm_add_epi64(s3, _mm_load_si128(v + i + 3));
    }
    const __m128i s = _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3));
    return (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s));
}

enum { KIND_Q4_0, KIND_Q8_0, KIND_Q4_K, KIND_Q5_K, KIND_Q6_K, KIND_F32, KIND_F16, KIND_BF16, KIND_Q4_0X8, KIND_Q4_KX8, KIND_Q6_KP, KIND_Q4_0P, KIND_Q4_KP,
       KIND_IQ2_XXS, KIND_IQ2_XS, KIND_IQ2_S,
       KIND_Q4_1, KIND_Q5_0, KIND_Q5_1, KIND_IQ4_NL, KIND_MXFP4,
       KIND_Q2_K, KIND_Q3_K, KIND_IQ4_XS, KIND_TQ2_0, KIND_TQ1_0,
       KIND_IQ3_XXS, KIND_IQ3_S, KIND_IQ1_S, KIND_IQ1_M,
       KIND_COUNT };
// ACT_A8_32P, ACT_A8_256P, ACT_A8_256K: the quants in Q4_0p, Q6_Kp and Q4_Kp order (quants.h)
enum { ACT_A8_32, ACT_A8_32P, ACT_A8_256, ACT_A8_256P, ACT_A8_256K, ACT_F32 };

// group: rows interleaved in the stored layout (FM_GROUP for the repacked ones, else 1)
typedef struct { int type, block, block_bytes, act, group; } fm_type_traits;
extern const fm_type_traits FM_TYPES[KIND_COUNT];

// the row dequantizers of the 3- and 1-bit i-quants (iq3_row_generic.c, iq1_row_generic.c)
void fm_deq_iq3_xxs(const void *w, float *y, int n);
void fm_deq_iq3_s(const void *w, float *y, int n);
void fm_deq_iq1_s(const void *w, float *y, int n);
void fm_deq_iq1_m(const void *w, float *y, int n);

int fm_kind_of(int type);                       // -1 if unsupported
fm_vec_dot_fn fm_dot_for(int isa, int kind);    // isa < 0: the active one
fm_vec_dot_n_fn fm_dotn_for(int isa, int kind); // NULL where the ISA has no batched kernel
fm_vec_dot_g_fn fm_dotg_for(int isa, int kind); // the kernel of a repacked kind
fm_vec_dot_r_fn fm_dotr_for(int isa, int kind); // NULL where the ISA takes the kind row by row

// run fn(ctx, task, thread) for task in [0, n_tasks) on the pool; returns when all are done
typedef void (*fm_task_fn)(void *ctx, int task, int thread);
void fm_pool_run(fm_pool *pool, fm_task_fn fn, void *ctx, int n_tasks);

// one weight matrix times n prepared activations (already quantized for its type)
typedef struct {
    const uint8_t *w;          // row 0 of the matrix, rows row_bytes apart
    size_t row_bytes;
    int kind, rows, cols, n;
    const void *const *acts;   // (n,) activation rows
    float *const *outs;        // (n,) output rows of `rows` floats
} fm_mv_job;

// all jobs' rows split across the pool; the caller keeps jobs, acts and outs alive
void fm_mv_run(fm_pool *pool, const fm_mv_job *jobs, int n_jobs);

#endif
