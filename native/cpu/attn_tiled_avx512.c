/* Causal attention (attn_tiled_body.h) in 16-float AVX-512 vectors. Built with the
 * AVX-512 flags. */
#include <immintrin.h>

#define V __m512
#define VW 16
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VSET1 _mm512_set1_ps
#define VZERO _mm512_setzero_ps()
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VMAX _mm512_max_ps
#define VMIN _mm512_min_ps
#define VFMA _mm512_fmadd_ps
#define VHSUM _mm512_reduce_add_ps
#define VHMAX _mm512_reduce_max_ps
#define VPOW2I(k) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), \
                                                                         _mm512_set1_epi32(127)), 23))
#include "ops.h"
#include "quants.h"

// KV_ROW_F32: n (a multiple of 32) values of an f16 or q8_0 cache row to floats
static inline __attribute__((always_inline)) void kv_row_f32(int kv_type, const void *src, float *dst, int n) {
    if (kv_type == FM_KV_F16) {
        const fm_f16 *h = src;
        for (int i = 0; i < n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
        return;
    }
    const block_q8_0 *b = src;   // q8_0
    for (int i = 0; i < n / QK32; i++, dst += QK32) {
        const __m512 d = _mm512_set1_ps(fm_half(b[i].d));
        for (int j = 0; j < QK32; j += 16) {
            const __m512i x = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b[i].qs + j)));
            _mm512_storeu_ps(dst + j, _mm512_mul_ps(_mm512_cvtepi32_ps(x), d));
        }
    }
}
#define KV_ROW_F32 kv_row_f32
#include "attn_tiled_body.h"

void fm_attn_tiled_avx512(FM_ATTN_ARGS) {
    attn_tiled(FM_ATTN_PASS);
}
