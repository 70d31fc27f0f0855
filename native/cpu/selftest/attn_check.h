/* The attention check of selftest.c: each ISA's tiled attention (ops.h: fm_attn_tiled) over a
 * KV cache of each type against the generic sibling, on a chunk of queries that straddles key
 * blocks. */
#ifndef FERMIUM_ATTN_CHECK_H
#define FERMIUM_ATTN_CHECK_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "fermium_cpu.h"
#include "random_blocks.h"

#define ATTN_TOL 2e-5   // expf against fm_expf, and fp32 sums in another order, on outputs of size ~1

static float uniform(void) { return ((int)(next() % 2001) - 1000) / 500.0f; }

// returns the failures
static int check_attention(void) {
    enum { T = 200, NQ = 77, NKV = 2, G = 8, HD = 128 };
    static const int KV[] = { 0, 1, 8 };
    static const char *KV_NAMES[] = { "f32", "f16", "q8_0" };
    float *q = malloc(sizeof(float) * NQ * NKV * G * 2 * HD), *x = malloc(sizeof(float) * T * NKV * HD);
    float *o = malloc(sizeof(float) * 2 * NQ * G * HD), *work = malloc(sizeof(float) * fm_attn_tiled_work(G, HD));
    void *k = malloc(sizeof(float) * T * NKV * HD), *v = malloc(sizeof(float) * T * NKV * HD);
    int failures = 0;
    for (int i = 0; i < NQ * NKV * G * 2 * HD; i++) q[i] = uniform();
    for (int t = 0; t < 3; t++) {
        const size_t head = fm_kv_head_bytes(KV[t], HD);
        for (int i = 0; i < T * NKV * HD; i++) x[i] = uniform();
        fm_kv_store(KV[t], x, k, T * NKV * HD);
        for (int i = 0; i < T * NKV * HD; i++) x[i] = uniform();
        fm_kv_store(KV[t], x, v, T * NKV * HD);
        printf("attention %-4s", KV_NAMES[t]);
        for (int isa = 1; isa < 4; isa++) {
            if (!fm_isa_supported(isa)) continue;
            double worst = 0.0;
            for (int h = 0; h < NKV; h++) {
                for (int side = 0; side < 2; side++)   // the generic sibling, then this ISA's
                    fm_attn_tiled_isa(side ? isa : 0, q + h * G * 2 * HD, NKV * G * 2 * HD, 2 * HD,
                                      (const char *)k + h * head, (const char *)v + h * head, NKV * head, KV[t],
                                      o + side * NQ * G * HD, G * HD, HD, NQ, T - NQ, 0, T, G, HD,
                                      1.0f / sqrtf((float)HD), work, NULL);
                for (int i = 0; i < NQ * G * HD; i++) worst = fmax(worst, fabs((double)o[NQ * G * HD + i] - o[i]));
            }
            failures += worst > ATTN_TOL;
            printf("  %s %s %.1e", fm_isa_name(isa), worst <= ATTN_TOL ? "ok" : "FAIL", worst);
        }
        printf("\n");
    }
    free(q); free(x); free(o); free(work); free(k); free(v);
    return failures;
}

#endif
