/* Memory read bandwidth: a streaming sum over a buffer far larger than the caches, split
 * across the pool's threads; the ceiling the decode kernels are measured against. Each
 * repetition streams twice, with plain loads and with the software prefetch the kernels use
 * (quants.h), and the faster counts: on some hosts the prefetched stream reads faster, on
 * others it is level (docs/performance.md). The buffer asks for 2 MB pages, as the weights do. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "internal.h"

#define CHUNK (1 << 20)
#define HUGE_PAGE ((size_t)2 << 20)   // a whole number of chunks

typedef struct { const uint64_t *buf; size_t words_per_chunk; int ahead; uint64_t sums[256]; } bw_ctx;

// one chunk of the buffer, plain or prefetched as the kernels request their weights
static void bw_task(void *arg, int task, int thread) {
    bw_ctx *c = arg;
    c->sums[thread & 255] += fm_stream_sum(c->buf + (size_t)task * c->words_per_chunk, CHUNK, c->ahead);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct fm_membw_buf { bw_ctx c; size_t n_chunks; uint64_t *buf; };

fm_membw_buf *fm_membw_new(fm_pool *pool, size_t bytes) {
    fm_membw_buf *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->n_chunks = (bytes / HUGE_PAGE) * (HUGE_PAGE / CHUNK);
    if (!b->n_chunks || !(b->buf = aligned_alloc(HUGE_PAGE, b->n_chunks * CHUNK))) {
        free(b);
        return NULL;
    }
    // in 2 MB pages where the kernel gives them, as the weights ask for theirs
    // (common/model/huge_pages.py): against a buffer in 4 KB pages, a TLB miss every 4 KB, the
    // decode of weights in 2 MB pages read more than "the bandwidth"
    madvise(b->buf, b->n_chunks * CHUNK, MADV_HUGEPAGE);
    memset(b->buf, 1, b->n_chunks * CHUNK);
    b->c.buf = b->buf;
    b->c.words_per_chunk = CHUNK / sizeof(uint64_t);
    fm_pool_run(pool, bw_task, &b->c, (int)b->n_chunks);   // warm the pages
    return b;
}

double fm_membw_stream(fm_pool *pool, fm_membw_buf *b, int prefetch) {
    b->c.ahead = prefetch != 0;
    const double t0 = now();
    fm_pool_run(pool, bw_task, &b->c, (int)b->n_chunks);
    const double bw = (double)(b->n_chunks * CHUNK) / (now() - t0);
    volatile uint64_t sink = b->c.sums[0];
    (void)sink;
    return bw;
}

double fm_membw_run(fm_pool *pool, fm_membw_buf *b, int reps) {
    double best = 0.0;
    for (int r = 0; r < reps; r++)
        for (int prefetch = 0; prefetch < 2; prefetch++) {
            const double bw = fm_membw_stream(pool, b, prefetch);
            if (bw > best) best = bw;
        }
    return best;
}

void fm_membw_free(fm_membw_buf *b) {
    if (!b) return;
    free(b->buf);
    free(b);
}

double fm_membw(fm_pool *pool, size_t bytes, int reps) {
    fm_membw_buf *b = fm_membw_new(pool, bytes);
    if (!b) return -1.0;
    const double bw = fm_membw_run(pool, b, reps);
    fm_membw_free(b);
    return bw;
}
