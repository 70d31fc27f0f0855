/* The vision GEMM's microkernel and row ops (vision_gemm_body.h) in 16-float AVX-512 vectors:
 * 6 rows of patches x 32 weight rows, 12 accumulators. Built with the AVX-512 flags. */
#include <immintrin.h>
#include "vision.h"

#define V __m512
#define VW 16
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VSET1 _mm512_set1_ps
#define VZERO _mm512_setzero_ps()
#define VADD _mm512_add_ps
#define VFMA _mm512_fmadd_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VDIV _mm512_div_ps
#define VMAX _mm512_max_ps
#define VMIN _mm512_min_ps
#define VHSUM _mm512_reduce_add_ps
#define VHMAX _mm512_reduce_max_ps
#define VPOW2I(k) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), \
                                                                         _mm512_set1_epi32(127)), 23))
#define MR FM_VIS_AVX512_MR
#define NV (FM_VIS_AVX512_NR / VW)
#include "vision_gemm_body.h"

void fm_vis_micro_avx512(int kc, const float *const *a, const float *panel, float *c, size_t ldc,
                         const float *bias, int load_c) {
    vis_micro(kc, a, panel, c, ldc, bias, load_c);
}

float fm_vis_softmax_avx512(float *s, int n, float scale) {
    return vis_softmax_row(s, n, scale);
}

void fm_vis_gelu_tanh_avx512(float *r, int n) {
    vis_gelu_tanh_row(r, n);
}
