/* The causal depthwise conv update of one decode step, then SiLU (ops.h: fm_conv_update), as
 * plain C that the compiler vectorizes across channels: restrict pointers, and the state's
 * stride of K-1 = 3 floats taken apart by shuffles (SSSE3 has those, SSE2 does not, so the
 * generic build stays scalar). Included by ops.c (the generic sibling) and gdn_ssse3.c,
 * gdn_avx2.c, each built with its ISA's flags; the same operations in the same order in all
 * of them, so the siblings agree bit for bit. */
#ifndef FERMIUM_CONV_BODY_H
#define FERMIUM_CONV_BODY_H
#include <stddef.h>
// O3 and no-trapping-math as in ops.c, before activations.h, so that its fm_silu vectorizes here
// too (where it came in earlier, through ops.h, the including file has made the same choice)
#pragma GCC push_options
#pragma GCC optimize("O3", "no-trapping-math")
#include "activations.h"

// C channels with K taps each; inlined with K a constant, its loops over the taps unroll and
// the loop over channels vectorizes
static inline __attribute__((always_inline)) void conv_channels(float *restrict state, const float *restrict w,
                                                                 const float *restrict x, float *restrict out,
                                                                 int C, int K) {
    for (int c = 0; c < C; c++) {
        float *s = state + (size_t)c * (K - 1);
        const float *wc = w + (size_t)c * K;
        float acc = wc[K - 1] * x[c];
        for (int j = 0; j < K - 1; j++) acc += wc[j] * s[j];
        for (int j = 0; j + 1 < K - 1; j++) s[j] = s[j + 1];
        if (K > 1) s[K - 2] = x[c];
        out[c] = acc;
    }
}

static void conv_update(float *restrict state, const float *restrict w, const float *restrict x, float *restrict out,
                        int C, int K) {
    if (K == 4) conv_channels(state, w, x, out, C, 4);   // the models' kernel
    else conv_channels(state, w, x, out, C, K);
    for (int c = 0; c < C; c++) out[c] = fm_silu(out[c]);   // apart: this loop vectorizes
}
#pragma GCC pop_options

#endif
