/* One Gated DeltaNet value head, S (dk, dv) row-major, in VW-float vectors; included by
 * gdn_ssse3.c and gdn_avx2.c after they define the vector type and its operations:
 *   V, VW, VLOAD, VSTORE, VSTREAM, VSET1, VZERO, VSUB, VMUL, VFMA(a, b, c) = a * b + c.
 * Two passes over the state instead of three reads and two writes:
 *   1. mem = S0^T k, reading S0 row after row (one stream from memory);
 *   2. S = decay S0 + k delta^T and o = S^T q, with delta = beta (v - decay mem), since
 *      (decay S0)^T k = decay mem. S0 is in cache by now, so this pass goes in tiles of NV
 *      vectors of columns that keep their delta and o in registers through all dk rows. */
#ifndef FERMIUM_GDN_BODY_H
#define FERMIUM_GDN_BODY_H
#include <immintrin.h>
#include <stdint.h>

// rows of S requested ahead in pass 1: a head's 64 KB state starts a stream where
// none runs, which the hardware prefetchers pick up late, page by page; farther ahead than
// 8 rows (4 KB) gained nothing (docs/performance.md)
#define GDN_PREFETCH_ROWS 8

// a tile of NV vectors of columns through all dk rows: S = decay S0 + k delta^T, o = S^T q;
// STORE writes S (VSTORE, or VSTREAM for a state nothing reads again this step)
#define GDN_TILE(NV, NAME, STORE)                                                                 \
    static inline __attribute__((always_inline)) void gdn_tile##NV##NAME(                         \
        const float *S0, float *S, const float *q, const float *k, const float *v,                \
        const float *mem, V decay, V beta, float *o, int dk, int dv) {                            \
        V delta[NV], acc[NV];                                                                     \
        _Pragma("GCC unroll 4") for (int t = 0; t < NV; t++) {                                    \
            delta[t] = VMUL(beta, VSUB(VLOAD(v + t * VW), VMUL(decay, VLOAD(mem + t * VW))));     \
            acc[t] = VZERO;                                                                       \
        }                                                                                         \
        for (int i = 0; i < dk; i++) {                                                            \
            const V ki = VSET1(k[i]), qi = VSET1(q[i]);                                           \
            const float *row0 = S0 + (size_t)i * dv;                                              \
            float *row = S + (size_t)i * dv;                                                      \
            _Pragma("GCC unroll 4") for (int t = 0; t < NV; t++) {                                \
                const V s = VFMA(ki, delta[t], VMUL(decay, VLOAD(row0 + t * VW)));                \
                STORE(row + t * VW, s);                                                           \
                acc[t] = VFMA(s, qi, acc[t]);                                                     \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 4") for (int t = 0; t < NV; t++) VSTORE(o + t * VW, acc[t]);          \
    }

GDN_TILE(4, , VSTORE)
GDN_TILE(1, , VSTORE)
GDN_TILE(4, _stream, VSTREAM)
GDN_TILE(1, _stream, VSTREAM)

// S0 == S updates in place. stream: the stores of S bypass the caches, which spares reading a
// rollback slot's old lines before they are overwritten; only with every row of S aligned
static void gdn_head(const float *S0, float *S, const float *q, const float *k, const float *v, float decay,
                     float beta, float *o, int dk, int dv, int stream) {
    float mem[dv];
    const int vec_end = dv - dv % VW;
    memset(mem, 0, sizeof mem);
    for (int i = 0; i < dk; i++) {                       // 1. mem = S0^T k
        const float *row = S0 + (size_t)i * dv;
        if (i + GDN_PREFETCH_ROWS < dk)
            for (int j = 0; j < dv; j += 64 / (int)sizeof(float)) __builtin_prefetch(row + (size_t)GDN_PREFETCH_ROWS * dv + j, 0, 3);
        const V ki = VSET1(k[i]);
        for (int j = 0; j < vec_end; j += VW) VSTORE(mem + j, VFMA(VLOAD(row + j), ki, VLOAD(mem + j)));
        for (int j = vec_end; j < dv; j++) mem[j] += row[j] * k[i];
    }
    stream = stream && dv % VW == 0 && (uintptr_t)S % (VW * sizeof(float)) == 0;
    const V d = VSET1(decay), b = VSET1(beta);           // 2. the update and the readout
    int j = 0;
    if (stream) {
        for (; j + 4 * VW <= dv; j += 4 * VW) gdn_tile4_stream(S0 + j, S + j, q, k, v + j, mem + j, d, b, o + j, dk, dv);
        for (; j < vec_end; j += VW) gdn_tile1_stream(S0 + j, S + j, q, k, v + j, mem + j, d, b, o + j, dk, dv);
        _mm_sfence();   // the streamed lines reach memory before the pool reports this task done
        return;
    }
    for (; j + 4 * VW <= dv; j += 4 * VW) gdn_tile4(S0 + j, S + j, q, k, v + j, mem + j, d, b, o + j, dk, dv);
    for (; j < vec_end; j += VW) gdn_tile1(S0 + j, S + j, q, k, v + j, mem + j, d, b, o + j, dk, dv);
    for (; j < dv; j++) {                                // columns that fill no vector
        const float delta = beta * (v[j] - decay * mem[j]);
        float acc = 0.0f;
        for (int i = 0; i < dk; i++) {
            float *s = S + (size_t)i * dv + j;
            *s = decay * S0[(size_t)i * dv + j] + k[i] * delta;
            acc += *s * q[i];
        }
        o[j] = acc;
    }
}

#endif
