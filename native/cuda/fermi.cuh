// fermi.cuh: shared helpers for the prefill kernels, kept to the Fermi (sm_20) subset.
// fp32 arithmetic only: half and bfloat16 weights are widened with integer bit operations,
// so no cvt.f32.f16 or any other half instruction reaches the PTX.
#pragma once

#ifdef __CUDACC__
#define FM_HD __host__ __device__ __forceinline__
#else
#define FM_HD inline
#endif

#ifndef __CUDA_ARCH__
#include <string.h>
#endif

FM_HD float fm_bits_to_float(unsigned int bits) {
#ifdef __CUDA_ARCH__
    return __int_as_float((int)bits);
#else
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

// IEEE binary16 -> binary32 with integer ops (subnormals, inf and nan included)
FM_HD float fm_half_to_float(unsigned int h) {
    unsigned int sign = (h & 0x8000u) << 16;
    unsigned int expo = (h >> 10) & 0x1fu;
    unsigned int mant = h & 0x3ffu;
    if (expo == 0) {
        float f = (float)mant * 5.9604644775390625e-8f;   // mant * 2^-24
        return sign ? -f : f;
    }
    if (expo == 31) return fm_bits_to_float(sign | 0x7f800000u | (mant << 13));
    return fm_bits_to_float(sign | ((expo + 112u) << 23) | (mant << 13));
}

FM_HD float fm_bf16_to_float(unsigned int h) { return fm_bits_to_float((h & 0xffffu) << 16); }

FM_HD unsigned int fm_u16(const unsigned char* p) { return (unsigned int)p[0] | ((unsigned int)p[1] << 8); }

FM_HD float fm_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
FM_HD float fm_silu(float x) { return x / (1.0f + expf(-x)); }
