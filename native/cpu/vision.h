/* The vision tower's ops (native/vision_runner.py drives them): the batched matmul of an image's
 * patches with a weight matrix in its mmproj type, LayerNorm, the 2D rotary into per-head
 * planes, and the non-causal attention over all patches. cffi sees the FM_CDEF section; the
 * per-ISA microkernels are below it. Not the decode engine's ops: an image is hundreds to
 * thousands of rows at once, so these are compute-bound GEMMs, not weight streams. */
#ifndef FERMIUM_VISION_H
#define FERMIUM_VISION_H

#include <stddef.h>
#include "fermium_cpu.h"

// ---- FM_CDEF begin
// y[n, rows] (+)= x[n, cols] . W[rows, cols]^T + bias, then act (0 none, 1 GELU tanh, 2 GELU erf).
// W is `type` (f32, f16, bf16 or q8_0, ggml ids) with rows row_bytes apart; x rows ldx floats
// apart, y rows ldy apart; bias NULL or (rows,); accumulate: add to y instead of overwriting it.
// Returns 0, or -1 for a type it cannot read
int fm_vis_gemm(fm_pool *pool, int type, const void *w, size_t row_bytes, int rows, int cols, int n,
                const float *x, size_t ldx, float *y, size_t ldy, const float *bias, int accumulate, int act);
// y[n, dim] = LayerNorm(x) * w + b, row by row (y may alias x)
void fm_vis_layernorm(fm_pool *pool, const float *x, float *y, int n, int dim, const float *w, const float *b,
                      float eps);
// qkv[n, 3 heads hd] (q | k | v, head-major within each) -> q, k, v planes [heads, n, hd],
// q and k turned by the rotate-half rotary of cos, sin [n, hd]
void fm_vis_rotary_split(fm_pool *pool, const float *qkv, const float *cos, const float *sin, int n, int heads,
                         int hd, float *q, float *k, float *v);
// o[n, heads hd] = softmax(scale q k^T) v per head, every patch seeing every patch, over the
// planes of fm_vis_rotary_split; returns 0, or -1 where the work could not be allocated
int fm_vis_attention(fm_pool *pool, const float *q, const float *k, const float *v, int n, int heads, int hd,
                     float scale, float *o);
// ---- FM_CDEF end

// ---- the GEMM microkernels, one per ISA (vision_gemm_body.h): C[MR, NR] (+)= A[MR rows, kc]
// . panel[kc, NR], the A rows given by pointers at their first column, C rows ldc apart. bias
// (NR) NULL or added; load_c: start from C, else from zero. Beside each, its ISA's row ops:
// softmax: s[0..n) <- e^(scale (s - max s)), returning their sum; gelu_tanh: r[0..n) in place
typedef void (*fm_vis_micro_fn)(int kc, const float *const *a, const float *panel, float *c, size_t ldc,
                                const float *bias, int load_c);
typedef float (*fm_vis_softmax_fn)(float *s, int n, float scale);
typedef void (*fm_vis_gelu_fn)(float *r, int n);
typedef struct { fm_vis_micro_fn fn; fm_vis_softmax_fn softmax; fm_vis_gelu_fn gelu_tanh; int mr, nr; } fm_vis_kernel;
const fm_vis_kernel *fm_vis_kernel_active(void);   // the active ISA's (vision_gemm.c)
#define FM_VIS_MR_MAX 8
#define FM_VIS_NR_MAX 32
void fm_vis_micro_generic(int kc, const float *const *a, const float *panel, float *c, size_t ldc,
                          const float *bias, int load_c);
void fm_vis_micro_ssse3(int kc, const float *const *a, const float *panel, float *c, size_t ldc,
                        const float *bias, int load_c);
void fm_vis_micro_avx2(int kc, const float *const *a, const float *panel, float *c, size_t ldc,
                       const float *bias, int load_c);
void fm_vis_micro_avx512(int kc, const float *const *a, const float *panel, float *c, size_t ldc,
                         const float *bias, int load_c);
#define FM_VIS_DECLARE_ROW_OPS(isa) \
    float fm_vis_softmax_##isa(float *s, int n, float scale); \
    void fm_vis_gelu_tanh_##isa(float *r, int n);
FM_VIS_DECLARE_ROW_OPS(generic)
FM_VIS_DECLARE_ROW_OPS(ssse3)
FM_VIS_DECLARE_ROW_OPS(avx2)
FM_VIS_DECLARE_ROW_OPS(avx512)
#define FM_VIS_SSSE3_MR 3
#define FM_VIS_SSSE3_NR 16
#define FM_VIS_AVX2_MR 6
#define FM_VIS_AVX2_NR 16
#define FM_VIS_AVX512_MR 6
#define FM_VIS_AVX512_NR 32

#endif
