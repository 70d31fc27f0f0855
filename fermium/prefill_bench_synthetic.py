"""The synthetic model of `fermium bench prefill`: all 40 layers at the real Qwen3.6-35B-A3B widths
(hidden 2048, 256 experts top-8 of FFN 512, shared expert 512, Gated DeltaNet 16/32 heads of
128, attention 16/2 heads of 256, vocabulary 248320), Q4_K weights of random blocks with valid
scales, the streamed ones built straight in page-locked host memory.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

from common.model.config import ModelConfig
from common.model.gguf_file import Tensor

QWEN36_35B = ModelConfig(
    arch="qwen35moe", vocab_size=248320, hidden_size=2048, n_layers=40, n_nextn_layers=0,
    context_length=262144, rms_eps=1e-6, n_heads=16, n_kv_heads=2, head_dim=256, rope_dim=64,
    rope_theta=1e7, full_attention_interval=4, conv_kernel=4, n_k_heads=16, n_v_heads=32,
    head_k_dim=128, head_v_dim=128, v_head_layout="tiled", n_experts=256, n_experts_used=8,
    expert_ffn=512, shared_ffn=512)


class SyntheticModel:
    """GGUFModel's interface over tensors built in memory; streamed ones are page-locked."""
    host_pinned = True

    def __init__(self, cfg: ModelConfig, cuda, qtype: Q = Q.Q4_K, seed: int = 0):
        self.config, self.path, self.tensors = cfg, Path("synthetic"), {}
        rng = np.random.default_rng(seed)
        block, size = GGML_QUANT_SIZES[qtype]
        pool = rng.integers(0, 256, size=(1 << 16, size), dtype=np.uint8)    # 16 MiB of blocks
        d = np.float16(0.02 / 150)                                          # weights ~ N(0, 0.02)
        pool[:, 0:2] = np.full((len(pool), 1), d).view(np.uint8)
        pool[:, 2:4] = np.full((len(pool), 1), np.float16(d * 7.5)).view(np.uint8)
        # scale == min in every sub-block, so each one is zero-mean (d sc (q - 7.5)): tokens stay
        # distinct through the layers and route to many experts, as in a trained model
        pool[:, 8:12] = pool[:, 4:8]
        pool[:, 12:16] = (pool[:, 12:16] & 15) * 17
        flat = pool.reshape(-1)

        def quant(name: str, shape: tuple[int, ...], pinned: bool) -> None:
            nbytes = int(np.prod(shape[:-1])) * (shape[-1] // block * size)
            raw = cuda.pagelocked_empty(nbytes, np.uint8) if pinned else np.empty(nbytes, np.uint8)
            for o in range(0, nbytes, flat.size):
                n = min(flat.size, nbytes - o)
                raw[o:o + n] = flat[:n]
            self.tensors[name] = Tensor(name, qtype, shape, raw.reshape(*shape[:-1], -1))

        def f32(name: str, value: np.ndarray) -> None:
            v = value.astype(np.float32)
            self.tensors[name] = Tensor(name, Q.F32, v.shape, v.view(np.uint8).reshape(*v.shape[:-1], -1))

        H, E, F, Fs = cfg.hidden_size, cfg.n_experts, cfg.expert_ffn, cfg.shared_ffn
        nv, dv = cfg.n_v_heads, cfg.head_v_dim
        nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        quant("token_embd.weight", (cfg.vocab_size, H), False)
        quant("output.weight", (cfg.vocab_size, H), True)
        f32("output_norm.weight", np.ones(H))
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            f32(p + "attn_norm.weight", np.ones(H))
            f32(p + "post_attention_norm.weight", np.ones(H))
            if cfg.is_full_attention(i):
                quant(p + "attn_q.weight", (nh * 2 * hd, H), False)
                quant(p + "attn_k.weight", (nkv * hd, H), False)
                quant(p + "attn_v.weight", (nkv * hd, H), False)
                quant(p + "attn_output.weight", (H, nh * hd), False)
                f32(p + "attn_q_norm.weight", np.ones(hd))
                f32(p + "attn_k_norm.weight", np.ones(hd))
            else:
                quant(p + "attn_qkv.weight", (cfg.conv_channels, H), False)
                quant(p + "attn_gate.weight", (nv * dv, H), False)
                quant(p + "ssm_beta.weight", (nv, H), False)
                quant(p + "ssm_alpha.weight", (nv, H), False)
                quant(p + "ssm_out.weight", (H, nv * dv), False)
                f32(p + "ssm_conv1d.weight", rng.standard_normal((cfg.conv_channels, cfg.conv_kernel)) * 0.5)
                f32(p + "ssm_a", -np.exp(rng.standard_normal(nv) * 0.5))
                f32(p + "ssm_dt.bias", rng.standard_normal(nv) * 0.5)
                f32(p + "ssm_norm.weight", np.ones(dv))
            f32(p + "ffn_gate_inp.weight", rng.standard_normal((E, H)) / np.sqrt(H))
            quant(p + "ffn_gate_exps.weight", (E, F, H), True)
            quant(p + "ffn_up_exps.weight", (E, F, H), True)
            quant(p + "ffn_down_exps.weight", (E, H, F), True)
            quant(p + "ffn_gate_shexp.weight", (Fs, H), False)
            quant(p + "ffn_up_shexp.weight", (Fs, H), False)
            quant(p + "ffn_down_shexp.weight", (H, Fs), False)
            f32(p + "ffn_gate_inp_shexp.weight", rng.standard_normal(H) / np.sqrt(H))

    def tensor(self, name: str) -> Tensor:
        return self.tensors[name]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())
