/* The Gated DeltaNet head update (gdn_body.h) in 4-float SSE vectors, a multiply and an add
 * where AVX2 has one FMA, and the conv update (conv_body.h). Built with -mssse3 and nothing
 * wider. */
#include <stddef.h>
#include <string.h>
#include "vec_sse.h"
#include "ops.h"
#include "gdn_body.h"
#include "conv_body.h"

void fm_gdn_head_ssse3(FM_GDN_ARGS) {
    gdn_head(S0, S, q, k, v, decay, beta, o, dk, dv, stream);
}

void fm_conv_update_ssse3(FM_CONV_ARGS) {
    conv_update(state, w, x, out, C, K);
}
