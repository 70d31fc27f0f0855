/* The C interface of native/cpu: ISA dispatch, activation quantizers, the thread pool, the
 * matvec driver, the fp32 decode ops and the decode engine. cffi sees the FM_CDEF section. */
#ifndef FERMIUM_CPU_H
#define FERMIUM_CPU_H

#include <stddef.h>
#include <stdint.h>

// ---- FM_CDEF begin
// dispatch: 0 generic, 1 ssse3, 2 avx2, 3 avx512
int fm_isa_supported(int isa);
int fm_isa_best(void);
int fm_isa_select(int isa);           // 0 ok, -1 unsupported here
int fm_isa_active(void);
const char *fm_isa_name(int isa);

// per weight type: values per block, bytes per block, activation bytes for n values
int fm_type_supported(int type);
int fm_type_block(int type);
int fm_type_block_bytes(int type);
size_t fm_act_bytes(int type, int n);
void fm_quantize_act(int type, const float *x, int n, void *act);
float fm_vec_dot(int isa, int type, int n, const void *w, const void *act);
void fm_dequant_row(int type, const void *w, float *out, int n);

// thread pool
typedef struct fm_pool fm_pool;
fm_pool *fm_pool_new(int n_threads);
void fm_pool_free(fm_pool *pool);
int fm_pool_threads(const fm_pool *pool);

// y[b, rows] = W[rows, cols] . x[b, cols] for b < n (each weight row read once for all n)
void fm_matvec(fm_pool *pool, int type, const void *w, size_t row_bytes, int rows, int cols,
               int n, const float *x, float *y);

// streaming read bandwidth: bytes/s of summing `bytes` of memory, the best of `reps` times
// two streams (plain loads, and loads with software prefetch)
double fm_membw(fm_pool *pool, size_t bytes, int reps);
// ---- FM_CDEF end

#endif
