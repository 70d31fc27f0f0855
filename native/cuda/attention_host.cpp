// attention_host.cpp: run the prefill attention kernel of attention.cu on the CPU, for tests.
// A host program built by tests (g++ -std=c++20 -pthread) that runs every block of a launch as
// ATT_THREADS threads (host_launch.h), so the kernel's row mapping, stages and online softmax can
// be checked against numpy on a machine without a GPU.
//   attention_host Q KC VC GATE OUT T pos0 nh nkv hd ldg hsg goff
// Q [T, nh, hd], KC and VC [pos0 + T, nkv, hd], GATE (the gate at float goff) and OUT [T, nh * hd]
// are raw fp32 files; OUT is written.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "host_launch.h"
#include "attention.cu"

// ---------------------------------------------------------------------------- driver
static std::vector<float> load(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); exit(2); }
    fseek(f, 0, SEEK_END);
    std::vector<float> v(ftell(f) / 4 + 4);          // 16-byte aligned by the allocator, as the kernel wants
    fseek(f, 0, SEEK_SET);
    if (fread(v.data(), 4, v.size() - 4, f) != v.size() - 4) { fprintf(stderr, "short %s\n", path); exit(2); }
    fclose(f);
    return v;
}

int main(int argc, char** argv) {
    if (argc != 14) { fprintf(stderr, "usage: see the header of attention_host.cpp\n"); return 2; }
    std::vector<float> q = load(argv[1]), kc = load(argv[2]), vc = load(argv[3]), gate = load(argv[4]);
    const int T = atoi(argv[6]), pos0 = atoi(argv[7]), nh = atoi(argv[8]), nkv = atoi(argv[9]), hd = atoi(argv[10]);
    const int ldg = atoi(argv[11]), hsg = atoi(argv[12]), goff = atoi(argv[13]);
    std::vector<float> out((size_t)T * nh * hd, NAN);
    const float scale = (float)(1.0 / sqrt((double)hd));            // as Kernels.attention passes it
    launch((T * (nh / nkv) + ATT_BQ - 1) / ATT_BQ, nkv, ATT_THREADS, [&] {
        attn_prefill(q.data(), kc.data(), vc.data(), gate.data() + goff, ldg, hsg, out.data(), T, pos0, nh, nkv, hd,
                     scale);
    });
    FILE* f = fopen(argv[5], "wb");
    fwrite(out.data(), 4, out.size(), f);
    fclose(f);
    return 0;
}
