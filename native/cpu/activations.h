/* The scalar activations: e^x, SiLU, sigmoid and softplus as inline float functions that a loop
 * around them vectorizes. Shared by ops.c and the bodies of the per-ISA files (conv_body.h),
 * which include this alone, not ops.h: the ops' interface is ops.c's. */
#ifndef FERMIUM_ACTIVATIONS_H
#define FERMIUM_ACTIVATIONS_H

#include <math.h>

// e^x within 2 ulp for x in [-87, 88] (clamped outside): x = k ln2 + r, |r| <= ln2 / 2,
// e^r by its degree-6 Taylor polynomial, 2^k built in the exponent bits. Only float adds,
// multiplies and int conversions, so the loops of SiLU and sigmoid vectorize where expf's
// library calls would not.
static inline float fm_expf(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    const float k = (x * 1.44269504f + 12582912.0f) - 12582912.0f;   // round to nearest: 1.5 * 2^23
    const float r = (x - k * 0.693359375f) + k * 2.12194440e-4f;       // ln2 in two parts
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int i; float f; } two_k = { .i = ((int)k + 127) << 23 };
    return p * two_k.f;
}
static inline float fm_silu(float x) { return x / (1.0f + fm_expf(-x)); }
static inline float fm_sigmoid(float x) { return 1.0f / (1.0f + fm_expf(-x)); }
static inline float fm_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

#endif
