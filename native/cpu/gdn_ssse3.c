/* The Gated DeltaNet head update (gdn_body.h) in 4-float SSE vectors, a multiply and an add
 * where AVX2 has one FMA, and the conv update (conv_body.h). Built with -mssse3 and nothing
 * wider. */
#include <tmmintrin.h>
#include <stddef.h>
#include <string.h>
#include "quants.h"

#define V __m128
#define VW 4
#define VLOAD _mm_loadu_ps
#define VSTORE _mm_storeu_ps
#define VSET1 _mm_set1_ps
#define VZERO _mm_setzero_ps()
#define VSUB _mm_sub_ps
#define VMUL _mm_mul_ps
#define VFMA(a, b, c) _mm_add_ps(_mm_mul_ps(a, b), c)
#include "gdn_body.h"
#include "conv_body.h"

void fm_gdn_head_ssse3(float *S, const float *q, const float *k, const float *v, float decay, float beta,
                       float *o, int dk, int dv) {
    gdn_head(S, q, k, v, decay, beta, o, dk, dv);
}

void fm_conv_update_ssse3(FM_CONV_ARGS) {
    conv_update(state, w, x, out, C, K);
}
