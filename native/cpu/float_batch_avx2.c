/* AVX2 dot products of float weight rows (F32, F16 via F16C, BF16) with float activations, one
 * at a time or up to FM_DOTN_MAX at once (each 8 weights loaded once for all: the router of a
 * batch of 4 no longer reads its matrix 4 times). Built with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include <string.h>
#include "quants.h"
#include "simd256.h"

#define FLOAT_DOT(name, load8, scalar, bytes)                                         \
    float name(int n, const void *w, const void *a) {                                 \
        const float *y = a;                                                           \
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();                    \
        int i = 0;                                                                    \
        for (; i + 16 <= n; i += 16) {                                                \
            fm_prefetch_ahead((const char *)(w) + (size_t)i * (bytes), 16 * (bytes)); \
            s0 = _mm256_fmadd_ps(load8(w, i), _mm256_loadu_ps(y + i), s0);            \
            s1 = _mm256_fmadd_ps(load8(w, i + 8), _mm256_loadu_ps(y + i + 8), s1);    \
        }                                                                             \
        float s = hsum256_ps(_mm256_add_ps(s0, s1));                                  \
        for (; i < n; i++) s += scalar(w, i) * y[i];                                  \
        return s;                                                                     \
    }

// the same, for na activation rows at once, in the same order of operations (bit-identical
// to the row kernel, so a batch or a chunked prefill gives what one row at a time gives)
#define FLOAT_DOTN(name, load8, scalar, bytes)                                        \
    static inline __attribute__((always_inline)) void name##_n(int n, const void *w, const void *const *acts, \
                                                               const int na, float *out) { \
        __m256 s0[FM_DOTN_MAX], s1[FM_DOTN_MAX];                                      \
        _Pragma("GCC unroll 4")                                                       \
        for (int k = 0; k < na; k++) s0[k] = s1[k] = _mm256_setzero_ps();             \
        int i = 0;                                                                    \
        for (; i + 16 <= n; i += 16) {                                                \
            fm_prefetch_ahead((const char *)(w) + (size_t)i * (bytes), 16 * (bytes)); \
            const __m256 x0 = load8(w, i), x1 = load8(w, i + 8);                      \
            _Pragma("GCC unroll 4")                                                   \
            for (int k = 0; k < na; k++) {                                            \
                const float *y = acts[k];                                             \
                s0[k] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(y + i), s0[k]);           \
                s1[k] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(y + i + 8), s1[k]);       \
            }                                                                         \
        }                                                                             \
        _Pragma("GCC unroll 4")                                                       \
        for (int k = 0; k < na; k++) {                                                \
            const float *y = acts[k];                                                 \
            float t = hsum256_ps(_mm256_add_ps(s0[k], s1[k]));                        \
            for (int j = i; j < n; j++) t += scalar(w, j) * y[j];                     \
            out[k] = t;                                                               \
        }                                                                             \
    }                                                                                 \
    FM_DEFINE_DOTN(name, name##_n, uint8_t)

#define F32_LOAD(w, i) _mm256_loadu_ps((const float *)(w) + (i))
#define F32_ONE(w, i) (((const float *)(w))[i])
#define F16_LOAD(w, i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const fm_f16 *)(w) + (i))))
#define F16_ONE(w, i) _cvtsh_ss(((const fm_f16 *)(w))[i])
#define BF16_LOAD(w, i) _mm256_castsi256_ps(_mm256_slli_epi32( \
    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)(w) + (i)))), 16))

static inline float bf16_one(const void *w, int i) {
    uint32_t bits = (uint32_t)((const uint16_t *)w)[i] << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

FLOAT_DOT(fm_dot_f32_avx2, F32_LOAD, F32_ONE, 4)
FLOAT_DOT(fm_dot_f16_avx2, F16_LOAD, F16_ONE, 2)
FLOAT_DOT(fm_dot_bf16_avx2, BF16_LOAD, bf16_one, 2)
FLOAT_DOTN(fm_dotn_f32_avx2, F32_LOAD, F32_ONE, 4)
FLOAT_DOTN(fm_dotn_f16_avx2, F16_LOAD, F16_ONE, 2)
FLOAT_DOTN(fm_dotn_bf16_avx2, BF16_LOAD, bf16_one, 2)
