/* AVX-512 VNNI dot products of the lower-bit super-blocks (Q2_K, Q3_K, IQ4_XS, TQ2_0, TQ1_0) with
 * 8-bit activations, one row and batched: the 256-bit kernels of lowbit_body256.h with `vpdpwssd`
 * and `vpdpbusd` (AVX512-VL), as wider registers would only split each block's steps in two.
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni. */
#define LOWBIT_ISA avx512
#define LOWBIT_VNNI
#include "lowbit_body256.h"
