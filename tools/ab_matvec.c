/* One matvec timed over and over: the weight matrix at byte `offset` of each file given,
 * taken in turn (two files together can outgrow a large last-level cache), with n activation
 * rows on a pool of `threads`. Prints the mean and best GB/s of weights read and the memory
 * bandwidth measured right after. Linked against one build of native/cpu by ab_matvec.sh.
 *   ab_matvec TYPE ROWS COLS N THREADS ITERS FILE OFFSET [FILE OFFSET ...]
 * FERMIUM_ISA=generic|ssse3|avx2|avx512|avx512vbmi forces the kernels. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "fermium_cpu.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static const unsigned char *map_matrix(const char *path, size_t offset, size_t bytes) {
    const int fd = open(path, O_RDONLY);
    if (fd < 0) { perror(path); exit(1); }
    const size_t start = offset & ~(size_t)4095;
    void *m = mmap(NULL, offset - start + bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, (off_t)start);
    if (m == MAP_FAILED) { perror("mmap"); exit(1); }
    close(fd);
    return (const unsigned char *)m + (offset - start);
}

int main(int argc, char **argv) {
    if (argc < 9 || (argc - 7) % 2) {
        fprintf(stderr, "usage: %s TYPE ROWS COLS N THREADS ITERS FILE OFFSET [FILE OFFSET ...]\n", argv[0]);
        return 2;
    }
    const int type = atoi(argv[1]), rows = atoi(argv[2]), cols = atoi(argv[3]), n = atoi(argv[4]);
    const int threads = atoi(argv[5]), iters = atoi(argv[6]), n_files = (argc - 7) / 2;
    const char *isa = getenv("FERMIUM_ISA");
    for (int i = 0; isa && strcmp(fm_isa_name(i), "unknown"); i++)
        if (!strcmp(isa, fm_isa_name(i)) && fm_isa_select(i) != 0) { fprintf(stderr, "%s: not on this CPU\n", isa); return 2; }
    const size_t row_bytes = (size_t)cols / fm_type_block(type) * fm_type_block_bytes(type);
    const unsigned char *w[16];
    for (int f = 0; f < n_files && f < 16; f++)
        w[f] = map_matrix(argv[7 + 2 * f], strtoull(argv[8 + 2 * f], NULL, 10), rows * row_bytes);
    fm_pool *pool = fm_pool_new(threads);
    float *x = malloc(sizeof(float) * (size_t)n * cols), *y = malloc(sizeof(float) * (size_t)n * rows);
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    double sum = 0.0, best = 0.0;
    for (int k = 0; k < iters * n_files; k++) {
        const double t0 = now();
        fm_matvec(pool, type, w[k % n_files], row_bytes, rows, cols, n, x, y);
        const double gbs = rows * row_bytes / (now() - t0) / 1e9;
        sum += gbs;
        best = gbs > best ? gbs : best;
    }
    printf("%.3f %.3f %.3f\n", sum / (iters * n_files), best, fm_membw(pool, (size_t)1 << 30, 1) / 1e9);
    fm_pool_free(pool);
    return 0;
}
