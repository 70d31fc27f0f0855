/* Causal prefill attention (attn_tiled_body.h) in 16-float AVX-512 vectors. Built with the
 * AVX-512 flags. */
#include <immintrin.h>

#define V __m512
#define VW 16
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VSET1 _mm512_set1_ps
#define VZERO _mm512_setzero_ps()
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VMAX _mm512_max_ps
#define VMIN _mm512_min_ps
#define VFMA _mm512_fmadd_ps
#define VHSUM _mm512_reduce_add_ps
#define VHMAX _mm512_reduce_max_ps
#define VPOW2I(k) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), \
                                                                         _mm512_set1_epi32(127)), 23))
#include "attn_tiled_body.h"

void fm_attn_tiled_avx512(FM_ATTN_ARGS) {
    attn_tiled(q, q_tok, q_head, k, v, kv_tok, o, o_tok, o_head, nq, pos0, group, hd, scale, work);
}
