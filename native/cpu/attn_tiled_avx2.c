/* Causal prefill attention (attn_tiled_body.h) in 8-float AVX2 vectors with FMA. Built with
 * -mavx2 -mfma -mf16c. */
#include "vec_avx2.h"
#include "attn_tiled_body.h"

void fm_attn_tiled_avx2(FM_ATTN_ARGS) {
    attn_tiled(q, q_tok, q_head, k, v, kv_tok, o, o_tok, o_head, nq, pos0, group, hd, scale, work);
}
