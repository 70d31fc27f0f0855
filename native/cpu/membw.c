/* Memory read bandwidth: a streaming sum over a buffer far larger than the caches, split
 * across the pool's threads; the ceiling the decode kernels are measured against. Each
 * repetition streams twice, with plain loads and with the software prefetch the kernels use
 * (quants.h), and the faster counts: on some hosts the prefetched stream reads a third faster
 * (a 16-core Xeon: 17-18 GB/s plain against 21-25 with two threads), on others it is level. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "internal.h"

#define CHUNK (1 << 20)

typedef struct { const uint64_t *buf; size_t words_per_chunk; int ahead; uint64_t sums[256]; } bw_ctx;

// one cache line per step into four independent 128-bit sums: the loop is never the limit
static void bw_task(void *arg, int task, int thread) {
    bw_ctx *c = arg;
    const __m128i *p = (const __m128i *)(c->buf + (size_t)task * c->words_per_chunk);
    __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < c->words_per_chunk / 2; i += 4) {
        if (c->ahead) fm_prefetch_ahead(p + i, 64);   // as the kernels request their weights
        s0 = _mm_add_epi64(s0, _mm_load_si128(p + i));
        s1 = _mm_add_epi64(s1, _mm_load_si128(p + i + 1));
        s2 = _mm_add_epi64(s2, _mm_load_si128(p + i + 2));
        s3 = _mm_add_epi64(s3, _mm_load_si128(p + i + 3));
    }
    const __m128i s = _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3));
    c->sums[thread & 255] += (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s));
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double fm_membw(fm_pool *pool, size_t bytes, int reps) {
    const size_t n_chunks = bytes / CHUNK;
    uint64_t *buf = aligned_alloc(64, n_chunks * CHUNK);
    if (!buf) return -1.0;
    memset(buf, 1, n_chunks * CHUNK);
    bw_ctx *c = calloc(1, sizeof *c);
    c->buf = buf;
    c->words_per_chunk = CHUNK / sizeof(uint64_t);
    fm_pool_run(pool, bw_task, c, (int)n_chunks);   // warm the pages
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        for (c->ahead = 0; c->ahead < 2; c->ahead++) {
            double t0 = now();
            fm_pool_run(pool, bw_task, c, (int)n_chunks);
            double bw = (double)(n_chunks * CHUNK) / (now() - t0);
            if (bw > best) best = bw;
        }
    }
    volatile uint64_t sink = c->sums[0];
    (void)sink;
    free(c);
    free(buf);
    return best;
}
