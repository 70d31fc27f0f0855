/* The 256-bit kernels of the lower-bit super-blocks (Q2_K, Q3_K, IQ4_XS, TQ2_0, TQ1_0): one weight
 * row . up to FM_DOTN_MAX activation rows, each 32-value step unpacked once and multiplied into
 * every activation; the row kernel is its instance for one activation. Included by
 * lowbit_batch_avx2.c and lowbit_batch_avx512.c, which define LOWBIT_ISA (and LOWBIT_VNNI on
 * AVX-512: `vpdpwssd` applies the scales and accumulates in one instruction, `vpdpbusd` sums the
 * ternary digits' products straight into int32). */
#include <immintrin.h>
#include "lowbit_simd.h"
#include "simd256.h"

#define INLINE static inline __attribute__((always_inline))
#define LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define ACT(i) ((const block_a8_256 *)acts[i])
#define FM_NAME_(kind, type, isa) fm_##kind##_##type##_a8_##isa
#define FM_NAME(kind, type, isa) FM_NAME_(kind, type, isa)   // isa expanded first
#define LOWBIT_KERNELS(type, body, block_t) \
    FM_DEFINE_DOTN(FM_NAME(dotn, type, LOWBIT_ISA), body, block_t) \
    FM_DEFINE_DOT1(FM_NAME(dot, type, LOWBIT_ISA), body, block_t)

// si += scale . p: int16 products p (pairs summed to int32 lanes), int16 scales
#ifdef LOWBIT_VNNI
#define MADD_ACC(si, p, s) _mm256_dpwssd_epi32(si, p, s)
#else
#define MADD_ACC(si, p, s) _mm256_add_epi32(si, _mm256_madd_epi16(p, s))
#endif

// the 2-bit field j (bits 2j, 2j+1) of every byte of q
INLINE __m256i bits2_256(__m256i q, int j) {
    return _mm256_and_si256(j ? _mm256_srli_epi16(q, 2 * j) : q, _mm256_set1_epi8(3));
}

// out[i] = the float sums of activation i; the float sums live in memory, touched once per block
INLINE void finish(float sums[][8], const int na, float *out) {
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = hsum256_ps(_mm256_load_ps(sums[i]));
}

// sums[i] += the block's int32 sums sum_i (an expression of i) times d and activation i's scale;
// the float sums kept in memory, out of the register budget
#define ACCUMULATE_BLOCK(sum_i)                                                             \
    do {                                                                                    \
        const float d = _cvtsh_ss(x[b].d);                                                  \
        _Pragma("GCC unroll 4")                                                             \
        for (int i = 0; i < na; i++) accumulate8(sums[i], sum_i, d * ACT(i)[b].d);          \
        __asm__ volatile("" ::: "memory");                                                  \
    } while (0)

// ---- Q2_K and Q3_K: step j of half h is values 128h + 32j .. +31, groups 8h + 2j (low 128
// bits) and 8h + 2j + 1 (high), so the scales of half h broadcast in both lanes, picked by
// pattern 8 + j, apply to it

INLINE void q2_K_n(int n, const block_q2_K *x, const void *const *acts, const int na, float *out) {
    const __m128i m4 = _mm_set1_epi8(0xF);
    float sums[FM_DOTN_MAX][8] __attribute__((aligned(32))) = { { 0 } };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i s8 = _mm_loadu_si128((const __m128i *)x[b].scales), sc8 = _mm_and_si128(s8, m4);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4));
        const __m256i sc = _mm256_cvtepu8_epi16(sc8);
        __m256i si[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) si[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            const __m256i sch = _mm256_permute4x64_epi64(sc, h ? 0xEE : 0x44), qq = LOAD(x[b].qs + 32 * h);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) {
                const __m256i u = bits2_256(qq, j), scale = pick(sch, 8 + j);
                _Pragma("GCC unroll 4")
                for (int i = 0; i < na; i++) {
                    si[i] = MADD_ACC(si[i], _mm256_maddubs_epi16(u, LOAD(ACT(i)[b].qs + 128 * h + 32 * j)), scale);
                    __asm__("" : "+x"(si[i]));   // one running sum per activation, not a tree of temporaries
                }
            }
        }
        const float d = _cvtsh_ss(x[b].d), dmin = _cvtsh_ss(x[b].dmin);
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) {
            const block_a8_256 *y = ACT(i) + b;
            accumulate8(sums[i], si[i], d * y->d);
            accumulate8(sums[i], _mm256_madd_epi16(mins, LOAD(y->bsums)), -dmin * y->d);
        }
        __asm__ volatile("" ::: "memory");   // keep the sums in memory, out of the register budget
    }
    finish(sums, na, out);
}

// bit k of every byte of h, moved to bit 2 (the 16-bit shifts bring in no other bit 2)
INLINE __m256i bit_to_4_256(__m256i h, int k) {
    const __m256i moved = k >= 2 ? _mm256_srli_epi16(h, k - 2) : _mm256_slli_epi16(h, 2 - k);
    return _mm256_and_si256(moved, _mm256_set1_epi8(4));
}

INLINE void q3_K_n(int n, const block_q3_K *x, const void *const *acts, const int na, float *out) {
    float sums[FM_DOTN_MAX][8] __attribute__((aligned(32))) = { { 0 } };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m256i sc = _mm256_sub_epi16(_mm256_cvtepu8_epi16(q3k_scales8(x[b].scales)), _mm256_set1_epi16(32));
        const __m256i hm = LOAD(x[b].hmask);
        __m256i si[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++)   // the quants are stored as the value plus 4: -4 * scales . bsums
            si[i] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc, LOAD(ACT(i)[b].bsums)), 2));
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            const __m256i sch = _mm256_permute4x64_epi64(sc, h ? 0xEE : 0x44), qq = LOAD(x[b].qs + 32 * h);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) {
                const __m256i u = _mm256_or_si256(bits2_256(qq, j), bit_to_4_256(hm, 4 * h + j)), scale = pick(sch, 8 + j);
                _Pragma("GCC unroll 4")
                for (int i = 0; i < na; i++) {
                    si[i] = MADD_ACC(si[i], _mm256_maddubs_epi16(u, LOAD(ACT(i)[b].qs + 128 * h + 32 * j)), scale);
                    __asm__("" : "+x"(si[i]));
                }
            }
        }
        ACCUMULATE_BLOCK(si[i]);
    }
    finish(sums, na, out);
}

// ---- IQ4_XS: 32 bytes hold sub-blocks 2t (bytes 0..15) and 2t + 1; its low and high nibbles,
// their 128-bit halves exchanged, are each sub-block's 32 codes in order

INLINE void iq4_xs_n(int n, const block_iq4_xs *x, const void *const *acts, const int na, float *out) {
    const __m256i m4 = _mm256_set1_epi8(0xF), kv = _mm256_broadcastsi128_si256(iq4_codebook());
    float sums[FM_DOTN_MAX][8] __attribute__((aligned(32))) = { { 0 } };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m256i sc = _mm256_broadcastsi128_si256(iq4xs_scales16(&x[b]));
        __m256i si[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) si[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4")
        for (int t = 0; t < 4; t++) {
            const __m256i q = LOAD(x[b].qs + 32 * t);
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            _Pragma("GCC unroll 2")
            for (int s = 0; s < 2; s++) {
                const __m256i k = _mm256_shuffle_epi8(kv, _mm256_permute2x128_si256(lo, hi, s ? 0x31 : 0x20));
                const __m256i ak = _mm256_sign_epi8(k, k), scale = pick(sc, 2 * t + s);
                _Pragma("GCC unroll 4")
                for (int i = 0; i < na; i++) {
                    const __m256i v = _mm256_sign_epi8(LOAD(ACT(i)[b].qs + 64 * t + 32 * s), k);
                    si[i] = MADD_ACC(si[i], _mm256_maddubs_epi16(ak, v), scale);
                    __asm__("" : "+x"(si[i]));
                }
            }
        }
        ACCUMULATE_BLOCK(si[i]);
    }
    finish(sums, na, out);
}

// ---- the ternary types: digits (0..2) times activations, less the activations (the offset of
// 1). Without VNNI, summed as int16 from minus the sums of each 16 activations (at most
// 8 * 2 * 2 * 127 + 16 * 127 per lane) and one `pmaddwd` per block

#ifdef LOWBIT_VNNI
#define TQ_START(y) _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(LOAD((y)->bsums), _mm256_set1_epi16(1)))
#define TQ_STEP(acc, u, a) _mm256_dpbusd_epi32(acc, u, LOAD(a))
#define TQ_SUM(acc) (acc)
#else
#define TQ_START(y) _mm256_sub_epi16(_mm256_setzero_si256(), LOAD((y)->bsums))
#define TQ_STEP(acc, u, a) _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, LOAD(a)))
#define TQ_SUM(acc) _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
#endif

INLINE void tq2_0_n(int n, const block_tq2_0 *x, const void *const *acts, const int na, float *out) {
    float sums[FM_DOTN_MAX][8] __attribute__((aligned(32))) = { { 0 } };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        __m256i p[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) p[i] = TQ_START(ACT(i) + b);
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            const __m256i qq = LOAD(x[b].qs + 32 * h);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) {
                const __m256i u = bits2_256(qq, j);
                _Pragma("GCC unroll 4")
                for (int i = 0; i < na; i++) p[i] = TQ_STEP(p[i], u, ACT(i)[b].qs + 128 * h + 32 * j);
            }
        }
        ACCUMULATE_BLOCK(TQ_SUM(p[i]));
    }
    finish(sums, na, out);
}

// the digits of 32 bytes (trits_epi8 on both halves)
INLINE __m256i trits256(__m256i p) {
    const __m256i x = _mm256_subs_epu8(p, _mm256_set1_epi8(1));
    const __m256i s = _mm256_avg_epu8(x, _mm256_avg_epu8(x, _mm256_setzero_si256()));
    return _mm256_and_si256(_mm256_srli_epi16(s, 6), _mm256_set1_epi8(3));
}

INLINE __m256i times3_256(__m256i p) { return _mm256_add_epi8(p, _mm256_add_epi8(p, p)); }

// TQ1_0: values 32k .. +31 are digit k of qs[0..32] (k < 5); values 160 + 32m .. +31 are digits
// 2m and 2m + 1 of qs[32..48] (m < 2); values 224..255 digit 4 of qs[32..48], then qh's
INLINE void tq1_0_n(int n, const block_tq1_0 *x, const void *const *acts, const int na, float *out) {
    float sums[FM_DOTN_MAX][8] __attribute__((aligned(32))) = { { 0 } };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i b1 = _mm_loadu_si128((const __m128i *)(x[b].qs + 32)), b3 = times3_epi8(b1), b9 = times3_epi8(b3);
        const __m128i b27 = times3_epi8(b9), b81 = times3_epi8(b27);
        const __m256i tail[3] = { _mm256_set_m128i(b3, b1), _mm256_set_m128i(b27, b9), _mm256_set_m128i(tq1_qh_bytes(x[b].qh), b81) };
        __m256i p[FM_DOTN_MAX];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < na; i++) p[i] = TQ_START(ACT(i) + b);
        __m256i q = LOAD(x[b].qs);
        _Pragma("GCC unroll 8")
        for (int s = 0; s < 8; s++) {
            const __m256i u = trits256(s < 5 ? q : tail[s - 5]);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < na; i++) p[i] = TQ_STEP(p[i], u, ACT(i)[b].qs + 32 * s);
            if (s < 4) q = times3_256(q);
        }
        ACCUMULATE_BLOCK(TQ_SUM(p[i]));
    }
    finish(sums, na, out);
}

LOWBIT_KERNELS(q2_K, q2_K_n, block_q2_K)
LOWBIT_KERNELS(q3_K, q3_K_n, block_q3_K)
LOWBIT_KERNELS(iq4_xs, iq4_xs_n, block_iq4_xs)
LOWBIT_KERNELS(tq2_0, tq2_0_n, block_tq2_0)
LOWBIT_KERNELS(tq1_0, tq1_0_n, block_tq1_0)
