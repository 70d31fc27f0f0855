/* One row kernel streaming a matrix far larger than the caches, on one thread, against a
 * prefetched sum over the same memory: whether the kernel keeps up with the memory or is
 * bound by its own instructions (the selftest's figures are cache-resident). Not part of the
 * extension. Build from the repository root, beside selftest.c:
 *
 *   cc -O2 -Inative/cpu native/cpu/selftest/stream.c native/cpu/{dispatch,quantize,repack,ops}.c \
 *      native/cpu/*_generic.c build/native_cpu_isa/*.o -lm -o /tmp/fm_stream
 *   /tmp/fm_stream TYPE ISA [COLS]    e.g. /tmp/fm_stream 270 1: Q6_Kp through SSSE3
 *
 * TYPE is the GGUF type number (2 Q4_0, 12 Q4_K, 13 Q5_K, 14 Q6_K, 16 IQ2_XXS, 17 IQ2_XS, 22 IQ2_S) or a repacked one (258 Q4_0
 * and 268 Q4_K in groups of 8 rows; 270 Q6_Kp, 514 Q4_0p and 524 Q4_Kp row by row), ISA 0
 * generic, 1 ssse3, 2 avx2, 3 avx512; COLS the row width (default 2048). Best of 5 passes each.
 * Built with -DFM_PREFETCH_AHEAD=N in every file, it measures another prefetch distance, e.g. 4 KB:
 *
 *   python3 -c "import sys, pathlib; sys.path.insert(0, 'native/cpu'); import build; \
 *      build.compile_isa_objects(pathlib.Path('/tmp/pf4096'), extra_flags=('-DFM_PREFETCH_AHEAD=4096',))"
 *   cc -O2 -DFM_PREFETCH_AHEAD=4096 -Inative/cpu native/cpu/selftest/stream.c \
 *      native/cpu/{dispatch,quantize,repack,ops}.c native/cpu/*_generic.c /tmp/pf4096/*.o -lm -o /tmp/fm_stream4096
 *
 * The prefetched sum moves with the distance, so compare the kernels' GB/s of alternating runs,
 * not only the ratio. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>
#include "fermium_cpu.h"
#include "quants.h"
#include "internal.h"
#include "random_blocks.h"

#define MATRIX_BYTES ((size_t)384 << 20)
#define PASSES 5

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// a plain prefetched sum over the same bytes: the ceiling the kernel is set against
static double stream_gbs(const uint8_t *w, size_t bytes) {
    const double t0 = now();
    volatile uint64_t sink = fm_stream_sum(w, bytes, 1);
    (void)sink;
    return bytes / (now() - t0) / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TYPE ISA [COLS]\n", argv[0]);
        return 2;
    }
    const int type = atoi(argv[1]), isa = atoi(argv[2]), cols = argc > 3 ? atoi(argv[3]) : 2048;
    const int kind = fm_kind_of(type);
    const int group = kind < 0 ? 0 : FM_TYPES[kind].group;
    if (kind < 0 || !fm_isa_supported(isa) || cols % FM_TYPES[kind].block) {
        fprintf(stderr, "type %d, ISA %d or %d columns not available here\n", type, isa, cols);
        return 2;
    }
    const size_t row_bytes = (size_t)cols / FM_TYPES[kind].block * FM_TYPES[kind].block_bytes;
    const size_t rows = MATRIX_BYTES / row_bytes / group * group, bytes = rows * row_bytes;
    uint8_t *w = aligned_alloc(64, (bytes + 63) / 64 * 64), *act = aligned_alloc(64, (fm_act_bytes(type, cols) + 63) / 64 * 64);
    float *x = malloc(sizeof(float) * cols);
    const int source = fm_repack_source(type);
    if (source >= 0) {   // random rows of the source type, repacked
        uint8_t *src = aligned_alloc(64, (bytes + 63) / 64 * 64);
        fill_blocks(source, src, bytes);
        fm_repack(type, src, rows, cols, w);
        free(src);
    } else {
        fill_blocks(type, w, bytes);
    }
    for (int i = 0; i < cols; i++) x[i] = ((int)(next() % 2001) - 1000) / 500.0f;
    fm_quantize_act(type, x, cols, act);
    const fm_vec_dot_fn dot = group > 1 ? NULL : fm_dot_for(isa, kind);
    const fm_vec_dot_g_fn dotg = group > 1 ? fm_dotg_for(isa, kind) : NULL;
    const void *acts[1] = { act };
    double kernel = 0.0, stream = 0.0;
    volatile float sink = 0.0f;
    for (int pass = 0; pass < PASSES; pass++) {
        const double t0 = now();
        float s = 0.0f;
        if (dotg) {
            float y[FM_GROUP];
            for (size_t r = 0; r < rows; r += group) {
                dotg(cols, w + r * row_bytes, acts, 1, y);
                s += y[0];
            }
        } else {
            for (size_t r = 0; r < rows; r++) s += dot(cols, w + r * row_bytes, act);
        }
        const double k = bytes / (now() - t0) / 1e9, m = stream_gbs(w, bytes);
        sink += s;
        kernel = k > kernel ? k : kernel;
        stream = m > stream ? m : stream;
    }
    printf("type %s, %s, %d columns, one thread: kernel %.2f GB/s, stream %.2f GB/s, ratio %.3f\n", argv[1], fm_isa_name(isa), cols,
           kernel, stream, kernel / stream);
    free(w);
    free(act);
    free(x);
    return 0;
}
