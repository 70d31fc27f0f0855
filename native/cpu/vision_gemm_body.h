/* The vision GEMM's microkernel (vision.h: fm_vis_micro_fn) and the row ops that go with it (the
 * attention's softmax rows, GELU tanh) in VW-float vectors; included by
 * vision_gemm_{ssse3,avx2,avx512}.c after they define V, VW, VLOAD, VSTORE, VSET1, VZERO, VADD,
 * VSUB, VMUL, VDIV, VMAX, VMIN, VFMA, VHSUM, VHMAX, VPOW2I and MR (rows of A) and NV (vectors of a
 * panel row: NR = NV VW). Per column k of the microkernel: NV panel vectors loaded once for the MR
 * rows, each row's A value broadcast once for the NV vectors, so the MR x NV accumulators stay in
 * registers for the whole kc. */
#ifndef FERMIUM_VISION_GEMM_BODY_H
#define FERMIUM_VISION_GEMM_BODY_H

#include <math.h>
#include <stddef.h>
#include "ops.h"
#include "vexp_body.h"

static inline __attribute__((always_inline)) void vis_micro(int kc, const float *const *a, const float *panel,
                                                            float *c, size_t ldc, const float *bias, int load_c) {
    V acc[MR][NV];
    const float *ar[MR];
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {
        ar[i] = a[i];
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) {
            acc[i][j] = load_c ? VLOAD(c + (size_t)i * ldc + j * VW) : VZERO;
            if (bias) acc[i][j] = VADD(acc[i][j], VLOAD(bias + j * VW));
        }
    }
    for (int k = 0; k < kc; k++) {
        const float *p = panel + (size_t)k * (NV * VW);
        V w[NV];
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) w[j] = VLOAD(p + j * VW);
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {
            const V x = VSET1(ar[i][k]);
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[i][j] = VFMA(x, w[j], acc[i][j]);
        }
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) VSTORE(c + (size_t)i * ldc + j * VW, acc[i][j]);
}


// s[0..n) <- e^(scale (s - max s)); returns their sum
static inline float vis_softmax_row(float *s, int n, float scale) {
    V vm = VSET1(-INFINITY);
    int j = 0;
    for (; j + VW <= n; j += VW) vm = VMAX(vm, VLOAD(s + j));
    float m = VHMAX(vm);
    for (; j < n; j++) m = s[j] > m ? s[j] : m;
    const V vmax = VSET1(m), vscale = VSET1(scale);
    V sum = VZERO;
    for (j = 0; j + VW <= n; j += VW) {
        const V p = vexp(VMUL(VSUB(VLOAD(s + j), vmax), vscale));
        VSTORE(s + j, p);
        sum = VADD(sum, p);
    }
    float tail = 0.0f;
    for (; j < n; j++) tail += s[j] = fm_expf((s[j] - m) * scale);
    return VHSUM(sum) + tail;
}

// r[0..n) <- GELU tanh: 0.5 x (1 + tanh u) = x / (1 + e^(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3)
static inline void vis_gelu_tanh_row(float *r, int n) {
    const V c = VSET1(-2.0f * 0.7978845608f), c3 = VSET1(0.044715f), one = VSET1(1.0f);
    int j = 0;
    for (; j + VW <= n; j += VW) {
        const V x = VLOAD(r + j);
        const V u = VMUL(c, VFMA(VMUL(c3, x), VMUL(x, x), x));
        VSTORE(r + j, VDIV(x, VADD(one, vexp(u))));
    }
    for (; j < n; j++) {
        const float x = r[j];
        r[j] = x / (1.0f + fm_expf(-2.0f * 0.7978845608f * (x + 0.044715f * x * x * x)));
    }
}

#endif
