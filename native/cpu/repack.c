/* Weights repacked for SIMD (layouts in quants.h), the reference kernel of each repacked
 * layout, and the checksum that guards the repack cache on disk (native/cpu_repack.py). */
#include <string.h>
#include "quants.h"
#include "fermium_cpu.h"

static int repack_q4_0x8(const void *src, size_t rows, int cols, void *dst) {
    if (rows % FM_GROUP || cols % QK32) return -1;
    const size_t nb = (size_t)cols / QK32;
    const block_q4_0 *x = src;
    block_q4_0x8 *out = dst;
    for (size_t g = 0; g < rows / FM_GROUP; g++)
        for (size_t b = 0; b < nb; b++, out++)
            for (int r = 0; r < FM_GROUP; r++) {
                const block_q4_0 *blk = x + (g * FM_GROUP + r) * nb + b;
                out->d[r] = blk->d;
                for (int k = 0; k < 4; k++) memcpy(out->qs[k][r], blk->qs + 4 * k, 4);
            }
    return 0;
}

static int repack_q4_Kx8(const void *src, size_t rows, int cols, void *dst) {
    if (rows % FM_GROUP || cols % QK_K) return -1;
    const size_t nb = (size_t)cols / QK_K;
    const block_q4_K *x = src;
    block_q4_Kx8 *out = dst;
    for (size_t g = 0; g < rows / FM_GROUP; g++)
        for (size_t b = 0; b < nb; b++, out++)
            for (int r = 0; r < FM_GROUP; r++) {
                const block_q4_K *blk = x + (g * FM_GROUP + r) * nb + b;
                out->d[r] = blk->d;
                out->dmin[r] = blk->dmin;
                for (int c = 0; c < 12; c++) out->scales[c][r] = blk->scales[c];
                for (int j = 0; j < 4; j++)
                    for (int k = 0; k < 8; k++) memcpy(out->qs[j][k][r], blk->qs + 32 * j + 4 * k, 4);
            }
    return 0;
}

// the 6-bit quant (0..63) of value v of a Q6_K block (ggml's layout: ql holds the low nibbles
// of values l and l+32 of each half, low then high nibble for l+64 and l+96; qh the top bits)
static int q6_quant(const block_q6_K *b, int v) {
    const int h = v / 128, l = v % 128 % 32, g = v % 128 / 32;
    const uint8_t lo = b->ql[64 * h + l + 32 * (g & 1)];
    return ((g < 2 ? lo : lo >> 4) & 0xF) | ((b->qh[32 * h + l] >> (2 * g)) & 3) << 4;
}

static int repack_q6_Kp(const void *src, size_t rows, int cols, void *dst) {
    if (cols % QK_K) return -1;
    const block_q6_K *x = src;
    block_q6_Kp *out = dst;
    for (size_t b = 0; b < rows * (size_t)(cols / QK_K); b++, x++, out++) {
        int q[4][64];   // register r, byte j
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < 64; j++) q[r][j] = q6_quant(x, fm_q6kp_value(64 * r + j));
        for (int j = 0; j < 64; j++) {   // solved bit by bit from the decode (quants.h)
            // what Y >> 6 (16-bit lanes) puts in bits 2..5 of byte j: bits 0..3 of the byte above
            // it in its lane (R1's), nothing in the upper byte of a lane
            const int carry = j % 2 ? 0 : q[1][j + 1] & 0xF;
            const int z_lo = (q[2][j] ^ q[0][j] >> 2) & 0xF;   // R2 bits 0..3 = Z bits 0..3 ^ R0 bits 2..5
            const int z_hi = (q[3][j] >> 2 ^ carry) & 0xF;     // R3 bits 2..5 = Z bits 4..7 ^ carry
            const int z = z_lo | z_hi << 4;
            out->planes[0][j] = (uint8_t)(q[0][j] | ((q[2][j] >> 4 ^ z >> 4) & 3) << 6);   // R2 bits 4..5
            out->planes[1][j] = (uint8_t)(q[1][j] | ((q[3][j] ^ z >> 2) & 3) << 6);        // R3 bits 0..1
            out->planes[2][j] = (uint8_t)z;
        }
        memcpy(out->scales, x->scales, sizeof out->scales);
        out->d = x->d;
    }
    return 0;
}

static int repack_q4_0p(const void *src, size_t rows, int cols, void *dst) {
    if (cols % QK_Q4_0P) return -1;
    const block_q4_0 *x = src;
    block_q4_0p *out = dst;
    for (size_t g = 0; g < rows * (size_t)(cols / QK_Q4_0P); g++, x += 4, out++) {
        for (int b = 0; b < 4; b++) out->d[b] = x[b].d;
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 16; k++) out->qs[j][k] = x[k / 4].qs[4 * j + k % 4];
    }
    return 0;
}

// the 4-bit quant of value v (0..31) of sub-block s of a Q4_K block (ggml's layout: the 32-byte
// chunk s / 2 holds sub-block s in its low nibbles when s is even, in its high ones when odd)
static int q4k_quant(const block_q4_K *b, int s, int v) {
    const uint8_t byte = b->qs[32 * (s / 2) + v];
    return s % 2 ? byte >> 4 : byte & 0xF;
}

static int repack_q4_Kp(const void *src, size_t rows, int cols, void *dst) {
    if (cols % QK_K) return -1;
    const block_q4_K *x = src;
    block_q4_K *out = dst;
    for (size_t b = 0; b < rows * (size_t)(cols / QK_K); b++, x++, out++) {
        uint8_t qs[QK_K / 2];
        for (int r = 0; r < 8; r++)
            for (int k = 0; k < 16; k++)
                qs[16 * r + k] = (uint8_t)(q4k_quant(x, k / 4, 4 * r + k % 4) | q4k_quant(x, 4 + k / 4, 4 * r + k % 4) << 4);
        *out = *x;
        memcpy(out->qs, qs, sizeof qs);
    }
    return 0;
}

// each repacked layout: the GGUF type it holds and its repack
static const struct { int layout, source; int (*repack)(const void *src, size_t rows, int cols, void *dst); } LAYOUTS[] = {
    { FM_Q4_0X8, FM_Q4_0, repack_q4_0x8 }, { FM_Q4_KX8, FM_Q4_K, repack_q4_Kx8 }, { FM_Q6_KP, FM_Q6_K, repack_q6_Kp },
    { FM_Q4_0P, FM_Q4_0, repack_q4_0p }, { FM_Q4_KP, FM_Q4_K, repack_q4_Kp },
};

static int layout_index(int layout) {
    for (int i = 0; i < (int)(sizeof LAYOUTS / sizeof LAYOUTS[0]); i++)
        if (LAYOUTS[i].layout == layout) return i;
    return -1;
}

int fm_repack_source(int layout) {
    const int i = layout_index(layout);
    return i < 0 ? -1 : LAYOUTS[i].source;
}

int fm_repack(int layout, const void *src, size_t rows, int cols, void *dst) {
    const int i = layout_index(layout);
    return i < 0 ? -1 : LAYOUTS[i].repack(src, rows, cols, dst);
}

// the references: the same sums as fm_dot_q4_0_a8_generic and fm_dot_q4_K_a8_generic, on
// activations in ACT_A8_32P and ACT_A8_256K order
float fm_dot_q4_0p_a8_generic(int n, const void *w, const void *a) {
    const block_q4_0p *x = w;
    const int nb = n / QK32;
    const int8_t *q = a;
    const float *dy = fm_a32_d(a, nb);
    float sum = 0.0f;
    for (int g = 0; g < n / QK_Q4_0P; g++, q += QK_Q4_0P) {
        int s[4] = { 0 };
        for (int p = 0; p < QK_Q4_0P; p++) {
            const uint8_t byte = x[g].qs[p / 32][p % 16];
            s[fm_q4_0p_value(p) / QK32] += ((p / 16 % 2 ? byte >> 4 : byte & 0xF) - 8) * q[p];
        }
        for (int b = 0; b < 4; b++) sum += fm_f16_to_f32(x[g].d[b]) * dy[4 * g + b] * (float)s[b];
    }
    return sum;
}

float fm_dot_q4_Kp_a8_generic(int n, const void *w, const void *a) {
    const block_q4_K *x = w;
    const block_a8_256 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        uint8_t sc[8], mn;
        for (int j = 0; j < 8; j++) fm_scale_min_k4(j, x[b].scales, &sc[j], &mn);
        int si = 0;
        for (int p = 0; p < QK_K; p++) {
            const uint8_t byte = x[b].qs[p / 32 * 16 + p % 16];
            si += sc[fm_q4kp_value(p) / 32] * (p / 16 % 2 ? byte >> 4 : byte & 0xF) * y[b].qs[p];
        }
        sum += fm_f16_to_f32(x[b].d) * y[b].d * (float)si
             - fm_f16_to_f32(x[b].dmin) * y[b].d * (float)fm_mins_dot_k4(x[b].scales, y[b].bsums);
    }
    return sum;
}

// the reference: the same sums as fm_dot_q6_K_a8_generic, on activations in ACT_A8_256P order
float fm_dot_q6_Kp_a8_generic(int n, const void *w, const void *a) {
    const block_q6_Kp *x = w;
    const block_a8_256 *y = a;
    float sum = 0.0f;
    for (int b = 0; b < n / QK_K; b++) {
        int si = 0;
        for (int p = 0; p < QK_K; p++) {
            const uint8_t *X = x[b].planes[0], *Y = x[b].planes[1], *Z = x[b].planes[2];
            const int r = p / 64, j = p % 64;
            const int q = r == 0 ? X[j] & 63 : r == 1 ? Y[j] & 63 : r == 2 ? (Z[j] ^ X[j] >> 2) & 63
                        : (Z[j] >> 2 ^ Y[j] >> 6 ^ (j % 2 ? 0 : Y[j + 1] << 2)) & 63;
            si += x[b].scales[fm_q6kp_value(p) / 16] * (q - 32) * y[b].qs[p];
        }
        sum += fm_f16_to_f32(x[b].d) * y[b].d * (float)si;
    }
    return sum;
}

// the reference: the same sums as fm_dot_q4_0_a8_generic, row by row
void fm_dotg_q4_0x8_generic(int n, const void *w, const void *const *acts, int na, float *out) {
    const block_q4_0x8 *x = w;
    const int nb = n / QK32;
    for (int i = 0; i < na; i++)
        for (int r = 0; r < FM_GROUP; r++) {
            const int8_t *q = acts[i];
            const float *dy = fm_a32_d(acts[i], nb);
            float sum = 0.0f;
            for (int b = 0; b < nb; b++, q += QK32) {
                int s = 0;
                for (int k = 0; k < 4; k++)
                    for (int t = 0; t < 4; t++) {
                        const uint8_t v = x[b].qs[k][r][t];
                        s += ((v & 0xF) - 8) * q[4 * k + t] + ((v >> 4) - 8) * q[QK32 / 2 + 4 * k + t];
                    }
                sum += fm_f16_to_f32(x[b].d[r]) * dy[b] * (float)s;
            }
            out[i * FM_GROUP + r] = sum;
        }
}

// the reference: the same sums as fm_dot_q4_K_a8_generic, row by row
void fm_dotg_q4_Kx8_generic(int n, const void *w, const void *const *acts, int na, float *out) {
    const block_q4_Kx8 *x = w;
    for (int i = 0; i < na; i++)
        for (int r = 0; r < FM_GROUP; r++) {
            const block_a8_256 *y = acts[i];
            float sum = 0.0f;
            for (int b = 0; b < n / QK_K; b++) {
                int si = 0, mins = 0;
                uint8_t packed[12];
                for (int c = 0; c < 12; c++) packed[c] = x[b].scales[c][r];
                for (int j = 0; j < 4; j++) {
                    int s1 = 0, s2 = 0;
                    for (int k = 0; k < 8; k++)
                        for (int e = 0; e < 4; e++) {
                            const int q = x[b].qs[j][k][r][e], at = 64 * j + 4 * k + e;
                            s1 += (q & 0xF) * y[b].qs[at];
                            s2 += (q >> 4) * y[b].qs[at + 32];
                        }
                    uint8_t sc1, sc2, m1, m2;
                    fm_scale_min_k4(2 * j, packed, &sc1, &m1);
                    fm_scale_min_k4(2 * j + 1, packed, &sc2, &m2);
                    si += sc1 * s1 + sc2 * s2;
                    mins += m1 * (y[b].bsums[4 * j] + y[b].bsums[4 * j + 1]) + m2 * (y[b].bsums[4 * j + 2] + y[b].bsums[4 * j + 3]);
                }
                sum += fm_f16_to_f32(x[b].d[r]) * y[b].d * (float)si - fm_f16_to_f32(x[b].dmin[r]) * y[b].d * (float)mins;
            }
            out[i * FM_GROUP + r] = sum;
        }
}

// four interleaved multiply-xor lanes over 8-byte words (about 10 B per cycle), then the last
// bytes and the length mixed in: catches any changed, lost or added byte, not an attacker
static inline uint64_t mix(uint64_t h, uint64_t w) {
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

uint64_t fm_checksum(const void *data, size_t bytes) {
    uint64_t h[4] = { 1, 2, 3, 4 }, w;
    const uint8_t *p = data;
    size_t i = 0;
    for (; i + 32 <= bytes; i += 32)
        for (int l = 0; l < 4; l++) {
            memcpy(&w, p + i + 8 * l, 8);
            h[l] = mix(h[l], w);
        }
    for (int l = 0; i + 8 <= bytes; i += 8, l++) {   // up to 3 more whole words
        memcpy(&w, p + i, 8);
        h[l] = mix(h[l], w);
    }
    uint64_t tail = 0;   // the last 0..7 bytes
    memcpy(&tail, p + i, bytes - i);
    uint64_t out = mix(bytes, tail);
    for (int l = 0; l < 4; l++) out = mix(out, h[l]);
    return out;
}
