/* The Gated DeltaNet head update (gdn_body.h) in 8-float AVX2 vectors with FMA, and the conv
 * update (conv_body.h); the AVX-512 dispatch row uses both. Built with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>
#include "quants.h"

#define V __m256
#define VW 8
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VSET1 _mm256_set1_ps
#define VZERO _mm256_setzero_ps()
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VFMA _mm256_fmadd_ps
#include "gdn_body.h"
#include "conv_body.h"

void fm_gdn_head_avx2(float *S, const float *q, const float *k, const float *v, float decay, float beta,
                      float *o, int dk, int dv) {
    gdn_head(S, q, k, v, decay, beta, o, dk, dv);
}

void fm_conv_update_avx2(FM_CONV_ARGS) {
    conv_update(state, w, x, out, C, K);
}
