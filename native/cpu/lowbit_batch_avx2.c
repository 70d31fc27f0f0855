/* AVX2 dot products of the lower-bit super-blocks (Q2_K, Q3_K, IQ4_XS, TQ2_0, TQ1_0) with 8-bit
 * activations, one row and batched (lowbit_body256.h). Built with -mavx2 -mfma -mf16c. */
#define LOWBIT_ISA avx2
#include "lowbit_body256.h"
