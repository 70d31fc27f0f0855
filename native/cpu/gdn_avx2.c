/* The Gated DeltaNet head update (gdn_body.h) in 8-float AVX2 vectors with FMA, and the conv
 * update (conv_body.h); the AVX-512 dispatch row uses both. Built with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>
#include "quants.h"
#include "vec_avx2.h"
#include "ops.h"
#include "gdn_body.h"
#include "conv_body.h"

void fm_gdn_head_avx2(FM_GDN_ARGS) {
    gdn_head(S0, S, q, k, v, decay, beta, o, dk, dv, stream);
}

void fm_conv_update_avx2(FM_CONV_ARGS) {
    conv_update(state, w, x, out, C, K);
}
