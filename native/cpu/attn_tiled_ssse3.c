/* Causal attention (attn_tiled_body.h) in 4-float SSE vectors, a multiply and an add where AVX2
 * has one FMA. Built with -mssse3 and nothing wider: f16 converts by integer bit operations (no
 * F16C), q8_0 sign-extends by unpack and shift (no SSE4.1). */
#include "vec_sse.h"
#include "ops.h"

// 4 f16 values, zero-extended in the 32-bit lanes, to floats: exponent and mantissa shifted into
// place and scaled by 2^112 (which also makes the subnormals normal; a power of two keeps the
// mantissa), inf and NaN then given the all-ones exponent, and the sign
static inline __attribute__((always_inline)) __m128 f16x4_f32(__m128i h) {
    const __m128i em = _mm_and_si128(h, _mm_set1_epi32(0x7FFF)), sign = _mm_slli_epi32(_mm_xor_si128(h, em), 16);
    const __m128 scaled = _mm_mul_ps(_mm_castsi128_ps(_mm_slli_epi32(em, 13)),
                                     _mm_castsi128_ps(_mm_set1_epi32(0x77800000)));
    const __m128i infnan = _mm_and_si128(_mm_cmpgt_epi32(em, _mm_set1_epi32(0x7BFF)), _mm_set1_epi32(0x7F800000));
    return _mm_or_ps(scaled, _mm_castsi128_ps(_mm_or_si128(sign, infnan)));
}

// 8 int16 -> two vectors of 4 floats times d
static inline __attribute__((always_inline)) void i16x8_f32(__m128i x, __m128 d, float *dst) {
    _mm_storeu_ps(dst, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpacklo_epi16(x, x), 16)), d));
    _mm_storeu_ps(dst + 4, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpackhi_epi16(x, x), 16)), d));
}

// KV_ROW_F32: n (a multiple of 8) values of an f16 or q8_0 cache row to floats
static inline __attribute__((always_inline)) void kv_row_f32(int kv_type, const void *src, float *dst, int n) {
    const __m128i zero = _mm_setzero_si128();
    if (kv_type == FM_KV_F16) {
        const fm_f16 *h = src;
        for (int i = 0; i < n; i += 8) {
            const __m128i x = _mm_loadu_si128((const __m128i *)(h + i));
            _mm_storeu_ps(dst + i, f16x4_f32(_mm_unpacklo_epi16(x, zero)));
            _mm_storeu_ps(dst + i + 4, f16x4_f32(_mm_unpackhi_epi16(x, zero)));
        }
        return;
    }
    const block_q8_0 *b = src;   // q8_0
    for (int i = 0; i < n / QK32; i++, dst += QK32) {
        const __m128 d = _mm_set1_ps(fm_half(b[i].d));
        for (int j = 0; j < QK32; j += 16) {
            const __m128i x = _mm_loadu_si128((const __m128i *)(b[i].qs + j));
            i16x8_f32(_mm_srai_epi16(_mm_unpacklo_epi8(x, x), 8), d, dst + j);
            i16x8_f32(_mm_srai_epi16(_mm_unpackhi_epi8(x, x), 8), d, dst + j + 8);
        }
    }
}
#define KV_ROW_F32 kv_row_f32
#include "attn_tiled_body.h"

void fm_attn_tiled_ssse3(FM_ATTN_ARGS) {
    attn_tiled(FM_ATTN_PASS);
}
