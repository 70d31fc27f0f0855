/* Causal prefill attention (attn_tiled_body.h) in 8-float AVX2 vectors with FMA. Built with
 * -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include "simd256.h"

static inline __attribute__((always_inline)) float hmax256_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

#define V __m256
#define VW 8
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
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
#define VPOW2I(k) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), \
                                                                         _mm256_set1_epi32(127)), 23))
#include "attn_tiled_body.h"

void fm_attn_tiled_avx2(FM_ATTN_ARGS) {
    attn_tiled(q, q_tok, q_head, k, v, kv_tok, o, o_tok, o_head, nq, pos0, group, hd, scale, work);
}
