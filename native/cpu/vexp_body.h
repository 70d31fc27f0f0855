/* e^x as fm_expf (activations.h), VW lanes at once: included by a body after its ISA file has defined
 * V, VSET1, VMAX, VMIN, VADD, VSUB, VMUL, VFMA and VPOW2I. */
#pragma once

static inline __attribute__((always_inline)) V vexp(V x) {
    x = VMAX(VMIN(x, VSET1(88.0f)), VSET1(-87.0f));
    const V k = VSUB(VFMA(x, VSET1(1.44269504f), VSET1(12582912.0f)), VSET1(12582912.0f));
    const V r = VFMA(k, VSET1(2.12194440e-4f), VFMA(k, VSET1(-0.693359375f), x));
    V p = VSET1(1.0f / 720.0f);
    p = VFMA(p, r, VSET1(1.0f / 120.0f));
    p = VFMA(p, r, VSET1(1.0f / 24.0f));
    p = VFMA(p, r, VSET1(1.0f / 6.0f));
    p = VFMA(p, r, VSET1(0.5f));
    p = VFMA(p, r, VSET1(1.0f));
    p = VFMA(p, r, VSET1(1.0f));
    return VMUL(p, VPOW2I(k));
}
