/* The float-vector words that the shared op bodies (gdn_body.h, conv_body.h,
 * attn_tiled_body.h) are written in, as 8-float AVX2 vectors with FMA. Include it, then a body. */
#ifndef FERMIUM_VEC_AVX2_H
#define FERMIUM_VEC_AVX2_H
#include <immintrin.h>
#include "simd256.h"

#define V __m256
#define VW 8
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VSTREAM _mm256_stream_ps   // non-temporal, to a VW-float aligned address
#define VSET1 _mm256_set1_ps
#define VZERO _mm256_setzero_ps()
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VMAX _mm256_max_ps
#define VMIN _mm256_min_ps
#define VFMA _mm256_fmadd_ps
#define VHSUM hsum256_ps
#define VHMAX hmax256_ps
// 2^k for integral k, built in the exponent bits
#define VPOW2I(k) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), \
                                                                         _mm256_set1_epi32(127)), 23))
#endif
