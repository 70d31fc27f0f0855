/* One Gated DeltaNet value head, S (dk, dv) row-major, in VW-float vectors; included by
 * gdn_ssse3.c and gdn_avx2.c after they define the vector type and its operations:
 *   V, VW, VLOAD, VSTORE, VSET1, VZERO, VSUB, VMUL, VFMA(a, b, c) = a * b + c.
 * Two passes over the state instead of three reads and two writes:
 *   1. mem = S^T k, reading S row after row (one stream from memory);
 *   2. S = decay S + k delta^T and o = S^T q, with delta = beta (v - decay mem), since
 *      (decay S)^T k = decay mem. S is in cache by now, so this pass goes in tiles of NV
 *      vectors of columns that keep their delta and o in registers through all dk rows. */
#ifndef FERMIUM_GDN_BODY_H
#define FERMIUM_GDN_BODY_H

// rows of S requested ahead in pass 1: a head's 64 KB state starts a stream where
// none runs, which the hardware prefetchers pick up late, page by page; farther ahead than
// 8 rows (4 KB) gained nothing (docs/performance.md)
#define GDN_PREFETCH_ROWS 8

#define GDN_TILE(NV)                                                                              \
    static inline __attribute__((always_inline)) void gdn_tile##NV(                               \
        float *S, const float *q, const float *k, const float *v, const float *mem, V decay,      \
        V beta, float *o, int dk, int dv) {                                                       \
        V delta[NV], acc[NV];                                                                     \
        _Pragma("GCC unroll 4") for (int t = 0; t < NV; t++) {                                    \
            delta[t] = VMUL(beta, VSUB(VLOAD(v + t * VW), VMUL(decay, VLOAD(mem + t * VW))));     \
            acc[t] = VZERO;                                                                       \
        }                                                                                         \
        for (int i = 0; i < dk; i++) {                                                            \
            const V ki = VSET1(k[i]), qi = VSET1(q[i]);                                           \
            float *row = S + (size_t)i * dv;                                                      \
            _Pragma("GCC unroll 4") for (int t = 0; t < NV; t++) {                                \
                const V s = VFMA(ki, delta[t], VMUL(decay, VLOAD(row + t * VW)));                 \
                VSTORE(row + t * VW, s);                                                          \
                acc[t] = VFMA(s, qi, acc[t]);                                                     \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 4") for (int t = 0; t < NV; t++) VSTORE(o + t * VW, acc[t]);          \
    }

GDN_TILE(4)
GDN_TILE(1)

static void gdn_head(float *S, const float *q, const float *k, const float *v, float decay, float beta,
                     float *o, int dk, int dv) {
    float mem[dv];
    const int vec_end = dv - dv % VW;
    memset(mem, 0, sizeof mem);
    for (int i = 0; i < dk; i++) {                       // 1. mem = S^T k
        const float *row = S + (size_t)i * dv;
        if (i + GDN_PREFETCH_ROWS < dk)
            for (int j = 0; j < dv; j += 64 / (int)sizeof(float)) __builtin_prefetch(row + (size_t)GDN_PREFETCH_ROWS * dv + j, 0, 3);
        const V ki = VSET1(k[i]);
        for (int j = 0; j < vec_end; j += VW) VSTORE(mem + j, VFMA(VLOAD(row + j), ki, VLOAD(mem + j)));
        for (int j = vec_end; j < dv; j++) mem[j] += row[j] * k[i];
    }
    const V d = VSET1(decay), b = VSET1(beta);           // 2. the update and the readout
    int j = 0;
    for (; j + 4 * VW <= dv; j += 4 * VW) gdn_tile4(S + j, q, k, v + j, mem + j, d, b, o + j, dk, dv);
    for (; j < vec_end; j += VW) gdn_tile1(S + j, q, k, v + j, mem + j, d, b, o + j, dk, dv);
    for (; j < dv; j++) {                                // columns that fill no vector
        const float delta = beta * (v[j] - decay * mem[j]);
        float acc = 0.0f;
        for (int i = 0; i < dk; i++) {
            float *s = S + (size_t)i * dv + j;
            *s = decay * *s + k[i] * delta;
            acc += *s * q[i];
        }
        o[j] = acc;
    }
}

#endif
