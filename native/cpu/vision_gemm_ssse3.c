/* The vision GEMM's microkernel and row ops (vision_gemm_body.h) in 4-float SSE vectors, a
 * multiply and an add where AVX2 has an FMA: 3 rows of patches x 16 weight rows. Built with
 * -mssse3 only. */
#include "vec_sse.h"
#include "vision.h"

#define VDIV _mm_div_ps

#define MR FM_VIS_SSSE3_MR
#define NV (FM_VIS_SSSE3_NR / VW)
#include "vision_gemm_body.h"

void fm_vis_micro_ssse3(int kc, const float *const *a, const float *panel, float *c, size_t ldc,
                        const float *bias, int load_c) {
    vis_micro(kc, a, panel, c, ldc, bias, load_c);
}

float fm_vis_softmax_ssse3(float *s, int n, float scale) {
    return vis_softmax_row(s, n, scale);
}

void fm_vis_gelu_tanh_ssse3(float *r, int n) {
    vis_gelu_tanh_row(r, n);
}
