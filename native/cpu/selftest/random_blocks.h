/* Random valid weight blocks for the standalone checks in this folder (selftest.c, stream.c). */
#ifndef FERMIUM_RANDOM_BLOCKS_H
#define FERMIUM_RANDOM_BLOCKS_H
#include <stdint.h>
#include <string.h>
#include "fermium_cpu.h"
#include "quants.h"

static uint32_t rng = 12345;
static uint32_t next(void) { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; }

// `bytes` of blocks of `type` (Q6_Kp included): random bytes, every f16 scale field set to a
// small random normal value, float weights to values in [-1, 1]
static void fill_blocks(int type, uint8_t *w, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)next();
    const size_t bb = (size_t)fm_type_block_bytes(type);
    for (uint8_t *p = w; p + bb <= w + bytes; p += bb) {
        const fm_f16 h = fm_f32_to_f16(0.001f + 0.003f * (next() % 1000) / 1000.0f);
        if (type == FM_Q6_K || type == FM_Q6_KP) memcpy(p + 208, &h, 2);
        else if (type == FM_Q4_0 || type == FM_Q8_0 || type == FM_Q5_0 || type == FM_IQ4_NL || type == FM_IQ2_XXS
                 || type == FM_IQ2_XS || type == FM_IQ2_S) memcpy(p, &h, 2);
        else if (type == FM_Q4_1 || type == FM_Q5_1) { memcpy(p, &h, 2); memcpy(p + 2, &h, 2); }
        else if (type == FM_MXFP4) *p = (uint8_t)(118 + next() % 4);   // E8M0: 2^(e - 128), about 2^-9
        else if (type == FM_Q4_K || type == FM_Q5_K) { memcpy(p, &h, 2); memcpy(p + 2, &h, 2); }
        else if (type == FM_F32) { float f = ((int)(next() % 2001) - 1000) / 1000.0f; memcpy(p, &f, 4); }
        else if (type == FM_F16) memcpy(p, &h, 2);
        else { uint16_t bf = 0x3C00 | (next() & 0x80FF); memcpy(p, &bf, 2); }
    }
}

#endif
