// quant.cuh: decode 8 consecutive weights of one GGUF row into fp32.
// `row` points at the row's first block, `k` is the element index (a multiple of 8), `v` gets
// the values. The layouts are GGML's block formats; one trait per type, one interface:
//   QT::SPAN                    elements that share one scale (plain floats: a whole row)
//   QT::load_scale(row, k, sc)  the scale of the span holding k, loaded and decoded
//   QT::load(row, k, r)         the raw quant words of the 8 weights, widest aligned loads
//   QT::decode(r, sc, k, v, st) those words -> 8 floats at v[0], v[st], ... v[7 * st]
// Split so a GEMM can issue the loads of the next tile before computing the current one, and
// decode a scale once per span rather than once per 8 weights. dq8_<type>(row, k, v) is all
// four in a row. Host-callable as well, so tools can check them against gguf's numpy dequantizer.
// Alignment: f32, f16 and bf16 rows start on 16 bytes; Q4_K and Q5_K blocks too (144 and 176 are
// multiples of 16, so any row of them does when the tensor does); Q8_0, Q4_0 and Q6_K blocks
// are read in 16-bit words or the aligned words around them. The traits are in quant_core.cuh
// (floats, 32-element blocks, K-quants), quant_linear.cuh and quant_iq.cuh, with their alignments;
// this file gathers them.
#pragma once
#include "quant_core.cuh"
#include "quant_linear.cuh"
#include "quant_iq.cuh"

// ---------------------------------------------------------------------------- one call
#define FM_DQ8(name, qt)                                                                        \
    FM_HD void name(const unsigned char* row, int k, float* v) {                                \
        qt::scale sc;                                                                           \
        qt::load_scale(row, k, sc);                                                             \
        qt::raw r;                                                                              \
        qt::load(row, k, r);                                                                    \
        qt::decode(r, sc, k, v, 1);                                                             \
    }

FM_DQ8(dq8_f32, QT_f32)
FM_DQ8(dq8_f16, QT_f16)
FM_DQ8(dq8_bf16, QT_bf16)
FM_DQ8(dq8_q8_0, QT_q8_0)
FM_DQ8(dq8_q4_0, QT_q4_0)
FM_DQ8(dq8_q4_k, QT_q4_k)
FM_DQ8(dq8_q5_k, QT_q5_k)
FM_DQ8(dq8_q6_k, QT_q6_k)
FM_DQ8(dq8_q4_1, QT_q4_1)
FM_DQ8(dq8_q5_0, QT_q5_0)
FM_DQ8(dq8_q5_1, QT_q5_1)
FM_DQ8(dq8_q2_k, QT_q2_k)
FM_DQ8(dq8_q3_k, QT_q3_k)
FM_DQ8(dq8_tq1_0, QT_tq1_0)
FM_DQ8(dq8_tq2_0, QT_tq2_0)
FM_DQ8(dq8_iq4_nl, QT_iq4_nl)
FM_DQ8(dq8_iq4_xs, QT_iq4_xs)
FM_DQ8(dq8_mxfp4, QT_mxfp4)
FM_DQ8(dq8_iq2_xxs, QT_iq2_xxs)
FM_DQ8(dq8_iq2_xs, QT_iq2_xs)
FM_DQ8(dq8_iq2_s, QT_iq2_s)
FM_DQ8(dq8_iq3_xxs, QT_iq3_xxs)
FM_DQ8(dq8_iq3_s, QT_iq3_s)
FM_DQ8(dq8_iq1_s, QT_iq1_s)
FM_DQ8(dq8_iq1_m, QT_iq1_m)
