/* The KV cache types (common/kv_cache.py): a cache row's bytes per head, and the conversions of
 * K and V rows from and to f32 in plain C. The store is bit-identical to the numpy reference
 * (kv_encode): f16 rounded to nearest even as numpy's astype, q8_0 as ggml's
 * quantize_row_q8_0_ref. It runs once per token and layer; the attention kernels read the cache
 * through their own SIMD conversions (attn_tiled_*.c). */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "fermium_cpu.h"
#include "ops.h"
#include "quants.h"

size_t fm_kv_head_bytes(int kv_type, int hd) {
    switch (kv_type) {
    case FM_KV_F32: return sizeof(float) * (size_t)hd;
    case FM_KV_F16: return sizeof(fm_f16) * (size_t)hd;
    case FM_KV_Q8_0: return hd % QK32 ? 0 : (size_t)(hd / QK32) * sizeof(block_q8_0);
    default: return 0;
    }
}

// numpy's float32 -> float16: fm_f32_to_f16 rounds as it does; a NaN keeps its payload's top bits
static fm_f16 to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu)) {
        const uint16_t h = (uint16_t)(((x >> 16) & 0x8000u) | 0x7C00u | ((x & 0x7FFFFFu) >> 13));
        return (h & 0x3FF) ? h : (fm_f16)(h + 1);
    }
    return fm_f32_to_f16(f);
}

void fm_kv_store(int kv_type, const float *x, void *dst, int n) {
    if (kv_type == FM_KV_F32) {
        memcpy(dst, x, sizeof(float) * (size_t)n);
    } else if (kv_type == FM_KV_F16) {
        fm_f16 *h = dst;
        for (int i = 0; i < n; i++) h[i] = to_f16(x[i]);
    } else if (kv_type == FM_KV_Q8_0) {
        block_q8_0 *b = dst;
        for (int i = 0; i < n / QK32; i++, x += QK32) {
            float amax = 0.0f;
            for (int j = 0; j < QK32; j++) amax = fmaxf(amax, fabsf(x[j]));
            const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
            b[i].d = to_f16(d);
            for (int j = 0; j < QK32; j++) b[i].qs[j] = (int8_t)roundf(x[j] * id);
        }
    }
}

void fm_kv_load(int kv_type, const void *src, float *x, int n) {
    if (kv_type == FM_KV_F32) {
        memcpy(x, src, sizeof(float) * (size_t)n);
    } else if (kv_type == FM_KV_F16) {
        const fm_f16 *h = src;
        for (int i = 0; i < n; i++) x[i] = fm_f16_to_f32(h[i]);
    } else if (kv_type == FM_KV_Q8_0) {
        const block_q8_0 *b = src;
        for (int i = 0; i < n / QK32; i++) {
            const float d = fm_f16_to_f32(b[i].d);
            for (int j = 0; j < QK32; j++) x[i * QK32 + j] = (float)b[i].qs[j] * d;
        }
    }
}
