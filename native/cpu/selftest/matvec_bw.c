/* The matvec of a random matrix of each weight type given (about 64 MB, past the last-level
 * cache) through each ISA given, on a pool of THREADS, against the read bandwidth of the same pool
 * measured in the same run (the best of two streams, fm_membw_run): GB/s of weights read and their
 * share. Kernel and bandwidth passes alternate, each figure the best of REPS. The same figures as
 * tools/bench_matvec_types.py, without Python. Not part of the extension. Build from the
 * repository root as selftest.c:
 *
 *   cc -O2 -Inative/cpu native/cpu/selftest/matvec_bw.c native/cpu/{dispatch,quantize,repack,ops,pool,matvec,membw}.c \
 *      native/cpu/*_generic.c build/native_cpu_isa/*.o -lm -lpthread -o /tmp/fm_matvec_bw
 *   /tmp/fm_matvec_bw THREADS REPS TYPE[,TYPE...] ISA[,ISA...]   e.g. 2 5 16,17,22,12 1,2 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "fermium_cpu.h"
#include "quants.h"
#include "internal.h"
#include "random_blocks.h"

#define MATRIX_BYTES ((size_t)64 << 20)
#define COLS 4096
#define ITERS 4

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int parse(const char *s, int *out, int max) {
    int n = 0;
    for (char *end; *s && n < max; s = *end ? end + 1 : end) out[n++] = (int)strtol(s, &end, 10);
    return n;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s THREADS REPS TYPE[,TYPE...] ISA[,ISA...]\n", argv[0]);
        return 2;
    }
    const int threads = atoi(argv[1]), reps = atoi(argv[2]);
    int types[16], isas[4];
    const int n_types = parse(argv[3], types, 16), n_isas = parse(argv[4], isas, 4);
    fm_pool *pool = fm_pool_new(threads);
    fm_membw_buf *probe = fm_membw_new(pool, MATRIX_BYTES);
    float *x = malloc(sizeof(float) * COLS);
    for (int i = 0; i < COLS; i++) x[i] = ((int)(next() % 2001) - 1000) / 500.0f;
    printf("%d threads, %zu MB matrices of %d columns, best of %d\n", threads, MATRIX_BYTES >> 20, COLS, reps);
    for (int t = 0; t < n_types; t++) {
        const int type = types[t];
        if (!fm_type_supported(type) || fm_type_group(type) != 1) continue;
        const size_t row_bytes = (size_t)COLS / fm_type_block(type) * fm_type_block_bytes(type);
        const int rows = (int)(MATRIX_BYTES / row_bytes);
        uint8_t *w = aligned_alloc(64, (rows * row_bytes + 63) / 64 * 64);
        float *y = malloc(sizeof(float) * rows);
        fill_blocks(type, w, rows * row_bytes);
        double best[4] = { 0 }, stream = 0.0;
        for (int rep = 0; rep < reps; rep++) {
            for (int i = 0; i < n_isas; i++) {
                if (fm_isa_select(isas[i]) != 0) continue;
                for (int k = 0; k < ITERS; k++) {
                    const double t0 = now();
                    fm_matvec(pool, type, w, row_bytes, rows, COLS, 1, x, y);
                    const double gbs = rows * row_bytes / (now() - t0) / 1e9;
                    best[i] = gbs > best[i] ? gbs : best[i];
                }
            }
            const double bw = fm_membw_run(pool, probe, 1) / 1e9;
            stream = bw > stream ? bw : stream;
        }
        for (int i = 0; i < n_isas; i++)
            if (fm_isa_supported(isas[i]))
                printf("type %3d %-7s %6.2f GB/s of %6.2f: %5.1f%%\n", type, fm_isa_name(isas[i]), best[i], stream,
                       100.0 * best[i] / stream);
        free(w);
        free(y);
    }
    fm_membw_free(probe);
    fm_pool_free(pool);
    free(x);
    return 0;
}
