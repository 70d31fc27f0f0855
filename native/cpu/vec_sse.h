/* The float-vector words that the shared op bodies (gdn_body.h, conv_body.h,
 * attn_tiled_body.h) are written in, as 4-float SSE vectors: a multiply and an add where AVX2 has
 * one FMA. SSE only, for the files built with -mssse3. Include it, then a body. */
#ifndef FERMIUM_VEC_SSE_H
#define FERMIUM_VEC_SSE_H
#include <tmmintrin.h>
#include "simd128.h"

#define V __m128
#define VW 4
#define VLOAD _mm_loadu_ps
#define VSTORE _mm_storeu_ps
#define VSTREAM _mm_stream_ps      // non-temporal, to a VW-float aligned address
#define VSET1 _mm_set1_ps
#define VZERO _mm_setzero_ps()
#define VADD _mm_add_ps
#define VSUB _mm_sub_ps
#define VMUL _mm_mul_ps
#define VMAX _mm_max_ps
#define VMIN _mm_min_ps
#define VFMA(a, b, c) _mm_add_ps(_mm_mul_ps(a, b), c)
#define VHSUM hsum128_ps
#define VHMAX hmax128_ps
// 2^k for integral k, built in the exponent bits
#define VPOW2I(k) _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(k), _mm_set1_epi32(127)), 23))
#endif
