/* SSSE3-row dot products of float weight rows (F32, BF16) with float activations: four
 * 128-bit accumulators, so the adds' latency is hidden. F16 needs F16C (AVX) to convert
 * quickly; the SSSE3 row keeps the generic F16 dot. Built with -mssse3 only. */
#include <tmmintrin.h>
#include <string.h>
#include "quants.h"
#include "simd128.h"

// 16 weights at i as four float vectors; bf16 is the top half of an f32
#define F32_AT(w, i, k) _mm_loadu_ps((const float *)(w) + (i) + 4 * (k))
#define BF16_AT(w, i, k) _mm_castsi128_ps(((k) & 1 ? _mm_unpackhi_epi16 : _mm_unpacklo_epi16)( \
    _mm_setzero_si128(), _mm_loadu_si128((const __m128i *)((const uint16_t *)(w) + (i) + 8 * ((k) / 2)))))

#define FLOAT_DOT(name, at, scalar, bytes)                                            \
    float name(int n, const void *w, const void *a) {                                 \
        const float *y = a;                                                           \
        __m128 s0 = _mm_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                      \
        int i = 0;                                                                    \
        for (; i + 16 <= n; i += 16) {                                                \
            fm_prefetch_ahead((const char *)(w) + (size_t)i * (bytes), 16 * (bytes)); \
            s0 = _mm_add_ps(s0, _mm_mul_ps(at(w, i, 0), _mm_loadu_ps(y + i)));        \
            s1 = _mm_add_ps(s1, _mm_mul_ps(at(w, i, 1), _mm_loadu_ps(y + i + 4)));    \
            s2 = _mm_add_ps(s2, _mm_mul_ps(at(w, i, 2), _mm_loadu_ps(y + i + 8)));    \
            s3 = _mm_add_ps(s3, _mm_mul_ps(at(w, i, 3), _mm_loadu_ps(y + i + 12)));   \
        }                                                                             \
        float s = hsum128_ps(_mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));     \
        for (; i < n; i++) s += scalar(w, i) * y[i];                                  \
        return s;                                                                     \
    }

static inline float f32_at(const void *w, int i) { return ((const float *)w)[i]; }
static inline float bf16_at(const void *w, int i) {
    const uint32_t bits = (uint32_t)((const uint16_t *)w)[i] << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

FLOAT_DOT(fm_dot_f32_ssse3, F32_AT, f32_at, 4)
FLOAT_DOT(fm_dot_bf16_ssse3, BF16_AT, bf16_at, 2)
