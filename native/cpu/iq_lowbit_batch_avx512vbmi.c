/* AVX-512 VBMI dot products of IQ3_XXS and IQ3_S with up to FM_DOTN_MAX 8-bit activation rows,
 * and with one: the AVX-512 kernels' arithmetic (iq_lowbit_batch_avx512.c), the grid entries
 * looked up from registers. The grids' 3-bit codes (fm_iq3s_codes, fm_iq3xxs_codes, two a byte)
 * sit in 16 resp. 8 registers; `vpermi2b` reads 128 entries of such a table for all 64 indices
 * of a block at once, and blends by the indices' top bits put the table together. Each 16
 * entries are then spread to their 64 bytes: `vpermi2b` brings an entry's two code bytes side by
 * side, `vpmultishiftqb` moves each code to a byte of its own and `vpermb` gives its value.
 * Built with the AVX-512 F/BW/VL/VNNI/VBMI flags. */
#include "iq_simd512.h"

// vpermi2b patterns over (the codes of values 0 and 1 | of values 2 and 3) of 64 entries:
// SPREAD[k], for entries 16k+2w and 16k+2w+1, bytes 8w..8w+3 their 4 code bytes (the rest unread)
static const uint8_t SPREAD[4][64] __attribute__((aligned(64))) = {
#define W(e) (e), 64 + (e), (e) + 1, 65 + (e), 0, 0, 0, 0
#define K(k) W(16 * (k)), W(16 * (k) + 2), W(16 * (k) + 4), W(16 * (k) + 6), \
             W(16 * (k) + 8), W(16 * (k) + 10), W(16 * (k) + 12), W(16 * (k) + 14)
    { K(0) }, { K(1) }, { K(2) }, { K(3) } };
#undef K
#undef W
// vpmultishiftqb offsets: the code nibbles 0..7 of each 64-bit word's low half to bytes 0..7
#define NIBBLE_OFFSETS 0x1C1814100C080400LL
// and the 7-bit sign fields of IQ3_XXS's two scales_signs words in a 64-bit word to bytes 0..7
#define SIGN_FIELD_OFFSETS 0x352E2720150E0700LL

// the code bytes of the 64 entries of a block from a 256-entry table in t[0..3]: bit 7 of each
// index chooses the half
INLINE __m512i lookup256(const __m512i t[4], __m512i idx, __mmask64 bit7) {
    return _mm512_mask_blend_epi8(bit7, _mm512_permutex2var_epi8(t[0], idx, t[1]), _mm512_permutex2var_epi8(t[2], idx, t[3]));
}

// the 64 unsigned values of entries 16k..16k+15 from the code bytes of a block's 64 entries
INLINE __m512i entry_values(__m512i codes01, __m512i codes23, int k, __m512i levels) {
    const __m512i pairs = _mm512_permutex2var_epi8(codes01, _mm512_load_si512((const void *)SPREAD[k]), codes23);
    return _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(_mm512_set1_epi64(NIBBLE_OFFSETS), pairs), levels);
}

// a 64-entry vpermb table whose byte n is the value of code n & 7 (the bits above it are
// the next code's)
INLINE __m512i levels_table(const uint8_t values[8]) {
    return _mm512_set1_epi64((long long)load64(values));
}

INLINE void load_tables(__m512i *t, const uint8_t *codes, int n) {
    for (int i = 0; i < n; i++) t[i] = _mm512_load_si512((const void *)(codes + 64 * i));
}

INLINE void iq3_xxs_n(int n, const block_iq3_xxs *x, const void *const *acts, const int na, float *out) {
    static const uint8_t values[8] = FM_IQ3XXS_LEVELS;
    const __m512i levels = levels_table(values);
    __m512i lo[4], hi[4], ksigns[2];   // fm_iq3xxs_codes, fm_ksigns_iq2xs
    load_tables(lo, fm_iq3xxs_codes[0], 4);
    load_tables(hi, fm_iq3xxs_codes[1], 4);
    ksigns[0] = LOAD512(fm_ksigns_iq2xs);
    ksigns[1] = LOAD512(fm_ksigns_iq2xs + 64);
    float s[FM_DOTN_MAX] = { 0 };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m256i aux = _mm256_loadu_si256((const __m256i *)x[b].scales_signs);
        // each 7-bit sign field to a byte of its own (bit 7 another field's, which vpermi2b does
        // not read), and its sign byte looked up
        const __m512i fields = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(SIGN_FIELD_OFFSETS), _mm512_zextsi256_si512(aux));
        uint64_t words[4];   // the sign words of sub-blocks 2k, 2k+1 as one mask each
        _mm256_storeu_si256((__m256i *)words, _mm512_castsi512_si256(_mm512_permutex2var_epi8(ksigns[0], fields, ksigns[1])));
        const __m128i sc = iq3xxs_scales(aux);
        const __m512i idx = LOAD512(x[b].qs);
        const __mmask64 bit7 = _mm512_movepi8_mask(idx);
        const __m512i codes01 = lookup256(lo, idx, bit7), codes23 = lookup256(hi, idx, bit7);
        ZERO_ACC()
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 4; k++) {
            const __m512i u = entry_values(codes01, codes23, k, levels);
            PAIR_DOT(u, _cvtu64_mask64(words[k]), pick512(sc, PAIR[k]), k)
        }
        FINISH_BLOCK(_cvtsh_ss(x[b].d), FM_IQ3XXS_POW2)
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = s[i];
}

INLINE void iq3_s_n(int n, const block_iq3_s *x, const void *const *acts, const int na, float *out) {
    static const uint8_t values[8] = { 1, 3, 5, 7, 9, 11, 13, 15 };
    const __m512i levels = levels_table(values);
    __m512i lo[8], hi[8];   // fm_iq3s_codes: entries 0..255 in [0..3], 256..511 in [4..7]
    load_tables(lo, fm_iq3s_codes[0], 8);
    load_tables(hi, fm_iq3s_codes[1], 8);
    float s[FM_DOTN_MAX] = { 0 };
    for (int b = 0; b < n / QK_K; b++) {
        fm_prefetch_ahead(x + b, sizeof *x);
        const __m128i sc = iq3s_scales(x + b);
        const __m512i idx = LOAD512(x[b].qs);   // the indices' low 8 bits; qh holds bit 8 of entry e as its bit e
        const __mmask64 bit7 = _mm512_movepi8_mask(idx), bit8 = _cvtu64_mask64(load64(x[b].qh));
        const __m512i codes01 = _mm512_mask_blend_epi8(bit8, lookup256(lo, idx, bit7), lookup256(lo + 4, idx, bit7));
        const __m512i codes23 = _mm512_mask_blend_epi8(bit8, lookup256(hi, idx, bit7), lookup256(hi + 4, idx, bit7));
        ZERO_ACC()
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 4; k++) {
            const __m512i u = entry_values(codes01, codes23, k, levels);
            PAIR_DOT(u, _cvtu64_mask64(load64(x[b].signs + 8 * k)), pick512(sc, PAIR[k]), k)
        }
        FINISH_BLOCK(_cvtsh_ss(x[b].d), FM_IQ3S_POW2)
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < na; i++) out[i] = s[i];
}

IQ_KERNELS(iq3_xxs, avx512vbmi)
IQ_KERNELS(iq3_s, avx512vbmi)
