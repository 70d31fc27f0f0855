/* The vision GEMM's microkernel and row ops (vision_gemm_body.h) in 8-float AVX2 vectors with
 * FMA: 6 rows of patches x 16 weight rows, 12 accumulators. Built with -mavx2 -mfma -mf16c. */
#include "vec_avx2.h"
#include "vision.h"

#define VDIV _mm256_div_ps

#define MR FM_VIS_AVX2_MR
#define NV (FM_VIS_AVX2_NR / VW)
#include "vision_gemm_body.h"

void fm_vis_micro_avx2(int kc, const float *const *a, const float *panel, float *c, size_t ldc,
                       const float *bias, int load_c) {
    vis_micro(kc, a, panel, c, ldc, bias, load_c);
}

float fm_vis_softmax_avx2(float *s, int n, float scale) {
    return vis_softmax_row(s, n, scale);
}

void fm_vis_gelu_tanh_avx2(float *r, int n) {
    vis_gelu_tanh_row(r, n);
}
