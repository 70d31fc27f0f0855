/* Portable C dot products of the other 32-value block types (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4)
 * with 8-bit activations (ACT_A8_32). The reference every SIMD sibling is tested against; not
 * tuned for speed. Per block: dw * da * sum(code * q), plus the min times the activation
 * block's sum (s = da * sum(q)) for Q4_1 and Q5_1. */
#include "q32.h"

#define DOT_Q32_GENERIC(name, block_t, codes)                               \
    float name(int n, const void *w, const void *a) {                       \
        const block_t *x = w;                                               \
        const int nb = n / QK32;                                            \
        const int8_t *q = a;                                                \
        const float *dy = fm_a32_d(a, nb), *sy = fm_a32_s(a, nb);           \
        float sum = 0.0f;                                                   \
        for (int b = 0; b < nb; b++, q += QK32) {                           \
            int code[QK32], s = 0;                                          \
            float d, m;                                                     \
            codes(x + b, &d, &m, code);                                     \
            for (int j = 0; j < QK32; j++) s += code[j] * q[j];             \
            sum += d * dy[b] * (float)s + m * sy[b];                        \
        }                                                                   \
        return sum;                                                         \
    }

DOT_Q32_GENERIC(fm_dot_q4_1_a8_generic, block_q4_1, fm_q4_1_codes)
DOT_Q32_GENERIC(fm_dot_q5_0_a8_generic, block_q5_0, fm_q5_0_codes)
DOT_Q32_GENERIC(fm_dot_q5_1_a8_generic, block_q5_1, fm_q5_1_codes)
DOT_Q32_GENERIC(fm_dot_iq4_nl_a8_generic, block_iq4_nl, fm_iq4_nl_codes)
DOT_Q32_GENERIC(fm_dot_mxfp4_a8_generic, block_mxfp4, fm_mxfp4_codes)
