/* Causal attention (attn_tiled_body.h) in 8-float AVX2 vectors with FMA; f16 cache blocks
 * convert by F16C. Built with -mavx2 -mfma -mf16c. */
#include "vec_avx2.h"
#include "ops.h"
#include "quants.h"

// KV_ROW_F32: n (a multiple of 16) values of an f16 or q8_0 cache row to floats
static inline __attribute__((always_inline)) void kv_row_f32(int kv_type, const void *src, float *dst, int n) {
    if (kv_type == FM_KV_F16) {
        const fm_f16 *h = src;
        for (int i = 0; i < n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
        return;
    }
    const block_q8_0 *b = src;   // q8_0
    for (int i = 0; i < n / QK32; i++, dst += QK32) {
        const __m256 d = _mm256_set1_ps(fm_half(b[i].d));
        for (int j = 0; j < QK32; j += 8) {
            const __m256i x = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b[i].qs + j)));
            _mm256_storeu_ps(dst + j, _mm256_mul_ps(_mm256_cvtepi32_ps(x), d));
        }
    }
}
#define KV_ROW_F32 kv_row_f32
#include "attn_tiled_body.h"

void fm_attn_tiled_avx2(FM_ATTN_ARGS) {
    attn_tiled(FM_ATTN_PASS);
}
