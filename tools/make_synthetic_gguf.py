"""Write a random-weight GGUF of the qwen35moe architecture (or qwen3next, or the dense qwen35), for
decode benchmarks and tests.

Weights are random bytes in valid blocks with scales chosen so each matrix has a standard
deviation of about gain / sqrt(in): no quantizer runs, so a real-width file of a few GB takes
seconds. Tensors stream to disk one at a time.

    python tools/make_synthetic_gguf.py /tmp/syn-q4_0.gguf --layers 4 --type q4_0 [--mtp]
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.model.quants.mixes import MIXES, Mix  # noqa: E402
from tools.synthetic_blocks import MAKERS, write_tensors  # noqa: E402

# qwen3next: one ssm_ba matrix instead of ssm_alpha + ssm_beta; qwen35: a dense FFN of Widths.ffn, no experts
ARCHES = ("qwen35moe", "qwen3next", "qwen35")


@dataclass(frozen=True)
class Widths:
    hidden: int = 2048
    vocab: int = 248320
    experts: int = 256
    experts_used: int = 8
    expert_ffn: int = 512
    shared_ffn: int = 512
    k_heads: int = 16
    v_heads: int = 32
    head_k: int = 128
    head_v: int = 128
    heads: int = 16
    kv_heads: int = 2
    head_dim: int = 256
    rope_dim: int = 64
    conv_kernel: int = 4
    ffn: int = 6144              # the dense FFN (qwen35)


REAL = Widths()
# every matrix's input width a multiple of 256, so each recipe applies (K-quants included)
TINY = Widths(hidden=256, vocab=512, experts=8, experts_used=2, expert_ffn=256, shared_ffn=256,
              k_heads=2, v_heads=4, head_k=64, head_v=64, heads=2, kv_heads=1, head_dim=128, rope_dim=32, ffn=512)


# ---- recipes: the type of a matrix from its name, its layer and the file's layer count (1-D
# tensors are always F32): llama-quantize's mixes (common/model/quants/mixes.py), under their names

def _q4_k_m_fixture(name: str, layer: int, n_layers: int) -> T:
    # the test files' Q4_K_M, older than the mix table and kept so their bytes stay: Q6_K for the
    # LM head, attn_v and the even layers' expert ffn_down, Q5_K for the shared ffn_down
    if name == "output.weight" or name.endswith("attn_v.weight"):
        return T.Q6_K
    if name.endswith(("ffn_down_exps.weight", "ffn_down.weight")):
        return T.Q6_K if layer % 2 == 0 else T.Q4_K
    if name.endswith("ffn_down_shexp.weight"):
        return T.Q5_K
    return T.Q4_K


def _mix(mix: Mix) -> Callable[[str, int, int], T]:
    return lambda name, layer, n_layers: mix.type_of(name, n_layers, layer)


def _rotation(experts: tuple[T, ...], others: tuple[T, ...], *, embd: T,
              head: T = T.Q6_K) -> Callable[[str, int, int], T]:
    """A test file's mix: the experts' type turns with the layer through `experts`, the other
    matrices' with the layer and the name through `others`, so one small file runs each type by
    tensor and by layer, the embedding and the LM head included."""
    def type_of(name: str, layer: int, n_layers: int) -> T:
        if name == "output.weight":
            return head
        if name == "token_embd.weight":
            return embd
        if name.endswith("_exps.weight"):
            return experts[layer % len(experts)]
        return others[(layer + len(name)) % len(others)]
    return type_of


RECIPES: dict[str, Callable[[str, int, int], T]] = {name: _mix(mix) for name, mix in MIXES.items()}
RECIPES["q4_k_m"] = _q4_k_m_fixture
RECIPES["iq2_mix"] = _rotation((T.IQ2_XXS, T.IQ2_XS, T.IQ2_S), (T.IQ2_S, T.Q4_K), embd=T.IQ2_XS)
RECIPES["q32_mix"] = _rotation((T.MXFP4, T.IQ4_NL, T.Q4_1, T.Q5_1), (T.Q5_0, T.Q5_1, T.IQ4_NL, T.MXFP4),
                               embd=T.Q4_1, head=T.Q5_1)
RECIPES["lower_bit"] = _rotation((T.Q2_K, T.Q3_K), (T.Q3_K, T.IQ4_XS, T.TQ2_0, T.TQ1_0), embd=T.Q3_K)
RECIPES["iq_lowbit_mix"] = _rotation((T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M), (T.IQ3_S, T.IQ1_M, T.IQ3_XXS, T.IQ1_S),
                                     embd=T.IQ3_S, head=T.IQ3_XXS)
FLOAT_SMALL = ("ffn_gate_inp.weight", "ssm_alpha.weight", "ssm_beta.weight", "ssm_ba.weight")   # kept F32
ROUTER_GAIN = 4.0   # router logits of std ~4: clear top-k margins, so engines rarely disagree on a route


def _full_attention(p: str, w: Widths, H: int) -> list:
    return [(p + "attn_q.weight", (2 * w.heads * w.head_dim, H), "matrix"),
            (p + "attn_k.weight", (w.kv_heads * w.head_dim, H), "matrix"),
            (p + "attn_v.weight", (w.kv_heads * w.head_dim, H), "matrix"),
            (p + "attn_output.weight", (H, w.heads * w.head_dim), "matrix"),
            (p + "attn_q_norm.weight", (w.head_dim,), "norm"),
            (p + "attn_k_norm.weight", (w.head_dim,), "norm")]


def _moe(p: str, w: Widths, H: int) -> list:
    return [(p + "ffn_gate_inp.weight", (w.experts, H), "router"),
            (p + "ffn_gate_exps.weight", (w.experts, w.expert_ffn, H), "matrix"),
            (p + "ffn_up_exps.weight", (w.experts, w.expert_ffn, H), "matrix"),
            (p + "ffn_down_exps.weight", (w.experts, H, w.expert_ffn), "matrix"),
            (p + "ffn_gate_inp_shexp.weight", (H,), "small"),
            (p + "ffn_gate_shexp.weight", (w.shared_ffn, H), "matrix"),
            (p + "ffn_up_shexp.weight", (w.shared_ffn, H), "matrix"),
            (p + "ffn_down_shexp.weight", (H, w.shared_ffn), "matrix")]


def _dense(p: str, w: Widths, H: int) -> list:
    return [(p + "ffn_gate.weight", (w.ffn, H), "matrix"), (p + "ffn_up.weight", (w.ffn, H), "matrix"),
            (p + "ffn_down.weight", (H, w.ffn), "matrix")]


def _ffn(arch: str) -> Callable[[str, Widths, int], list]:
    return _dense if arch == "qwen35" else _moe


def _norms(p: str, H: int) -> list:
    return [(p + "attn_norm.weight", (H,), "norm"), (p + "post_attention_norm.weight", (H,), "norm")]


def mtp_plan(w: Widths, layers: int, arch: str = "qwen35moe") -> list:
    """The MTP block llama.cpp writes as blk.{layers}: the nextn tensors and a full-attention layer with
    the trunk's FFN.
    Qwen3.5/3.6 checkpoints share the embedding and the LM head, so it has no embed_tokens or head."""
    H, p = w.hidden, f"blk.{layers}."
    return ([(p + "nextn.eh_proj.weight", (H, 2 * H), "matrix"), (p + "nextn.enorm.weight", (H,), "norm"),
             (p + "nextn.hnorm.weight", (H,), "norm"), (p + "nextn.shared_head_norm.weight", (H,), "norm")]
            + _norms(p, H) + _full_attention(p, w, H) + _ffn(arch)(p, w, H))


def tensor_plan(w: Widths, layers: int, interval: int, arch: str = "qwen35moe", mtp: bool = False):
    """(name, shape (numpy order), kind) for every tensor; kind 'matrix', 'norm' or a 1-D role."""
    H, C = w.hidden, 2 * w.k_heads * w.head_k + w.v_heads * w.head_v
    plan = [("token_embd.weight", (w.vocab, H), "embed")]
    for i in range(layers):
        p = f"blk.{i}."
        plan += _norms(p, H)
        if (i + 1) % interval == 0:
            plan += _full_attention(p, w, H)
        else:
            plan += [(p + "attn_qkv.weight", (C, H), "matrix"),
                     (p + "attn_gate.weight", (w.v_heads * w.head_v, H), "matrix"),
                     (p + "ssm_conv1d.weight", (C, w.conv_kernel), "conv"), (p + "ssm_a", (w.v_heads,), "ssm_a"),
                     (p + "ssm_dt.bias", (w.v_heads,), "small"), (p + "ssm_norm.weight", (w.head_v,), "norm"),
                     (p + "ssm_out.weight", (H, w.v_heads * w.head_v), "matrix")]
            if arch == "qwen3next":
                plan += [(p + "ssm_ba.weight", (2 * w.v_heads, H), "matrix")]
            else:
                plan += [(p + "ssm_alpha.weight", (w.v_heads, H), "matrix"),
                         (p + "ssm_beta.weight", (w.v_heads, H), "matrix")]
        plan += _ffn(arch)(p, w, H)
    plan += [("output_norm.weight", (H,), "norm"), ("output.weight", (w.vocab, H), "matrix")]
    return plan + (mtp_plan(w, layers, arch) if mtp else [])    # last: the trunk's weights do not depend on mtp


def _recipe_layer(layer: int, layers: int, interval: int) -> int:
    # the MTP block is typed as the trunk's last full-attention layer is (the recipes vary by layer)
    if layer < layers or layers < interval:
        return layer
    return layers // interval * interval - 1


def _one_d(rng, kind: str, n: int) -> np.ndarray:
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    if kind == "ssm_a":
        return (-np.exp(0.5 * rng.standard_normal(n))).astype(np.float32)
    return (0.5 * rng.standard_normal(n)).astype(np.float32)


def write_synthetic(path: str | Path, *, layers: int = 4, recipe: str = "q4_0", widths: Widths = REAL,
                    gain: float = 0.5, seed: int = 0, interval: int = 4, arch: str = "qwen35moe",
                    byte_tokenizer: bool = False, mtp: bool = False) -> Path:
    if recipe not in RECIPES:
        raise ValueError(f"unknown type {recipe!r}; choose one of {', '.join(RECIPES)}")
    if arch not in ARCHES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHES)}")
    rng, w, path = np.random.default_rng(seed), widths, Path(path)
    writer = GGUFWriter(path, arch)
    for key, value in [("block_count", layers + int(mtp)), ("context_length", 262144), ("embedding_length", w.hidden),
                       ("attention.head_count", w.heads), ("attention.head_count_kv", w.kv_heads),
                       ("attention.key_length", w.head_dim), ("attention.value_length", w.head_dim),
                       ("rope.dimension_count", w.rope_dim), ("full_attention_interval", interval),
                       ("ssm.conv_kernel", w.conv_kernel), ("ssm.state_size", w.head_k),
                       ("ssm.group_count", w.k_heads), ("ssm.time_step_rank", w.v_heads),
                       ("ssm.inner_size", w.v_heads * w.head_v)]:
        writer.add_uint32(f"{arch}.{key}", value)
    ffn_keys = ([("feed_forward_length", w.ffn)] if arch == "qwen35" else
                [("expert_count", w.experts), ("expert_used_count", w.experts_used),
                 ("expert_feed_forward_length", w.expert_ffn), ("expert_shared_feed_forward_length", w.shared_ffn)])
    for key, value in ffn_keys:
        writer.add_uint32(f"{arch}.{key}", value)
    if mtp:   # as llama.cpp's converter: block_count counts the MTP block, this key says how many
        writer.add_uint32(f"{arch}.nextn_predict_layers", 1)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{arch}.rope.freq_base", 1e7)
    if arch != "qwen3next":   # multimodal RoPE sections, as converted checkpoints carry them (text: one position)
        third = round(w.rope_dim / 2 * 11 / 32)
        writer.add_array(f"{arch}.rope.dimension_sections", [third, third, w.rope_dim // 2 - 2 * third, 0])
    writer.add_string("general.name", f"synthetic-{recipe}-{layers}l")
    writer.add_uint32(f"{arch}.vocab_size", w.vocab)   # no tokenizer: llama.cpp then sizes its vocabulary by this
    if byte_tokenizer:
        add_byte_tokenizer(writer, w.vocab)
    else:
        writer.add_string("tokenizer.ggml.model", "none")

    def qtype_of(name: str, shape: tuple, kind: str):
        if len(shape) == 1 or kind == "conv" or name.endswith(FLOAT_SMALL):
            return T.F32
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        return RECIPES[recipe](name, _recipe_layer(layer, layers, interval), layers + int(mtp))

    def values(name: str, shape: tuple, kind: str, qtype) -> np.ndarray:
        if len(shape) == 1:
            return _one_d(rng, kind, shape[0]).view(np.uint8)
        if kind == "conv":
            return (0.5 * rng.standard_normal(shape)).astype(np.float32).view(np.uint8)
        fan_in = 1.0 if kind == "embed" else np.sqrt(shape[-1])
        std = {"embed": 1.0, "router": ROUTER_GAIN}.get(kind, gain) / fan_in
        return MAKERS[qtype](rng, int(np.prod(shape[:-1])), shape[-1], std)

    write_tensors(writer, path, tensor_plan(w, layers, interval, arch, mtp), qtype_of, values)
    return path


def add_byte_tokenizer(writer: GGUFWriter, vocab: int) -> None:
    """A byte-level BPE vocabulary of the bytes, one merge (two spaces) and the chat markers,
    padded to `vocab` with tokens that no text encodes to: enough for the router to serve the file."""
    from common.model.tokenizer import _BYTE_DECODER
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = [*sorted(_BYTE_DECODER, key=_BYTE_DECODER.get), "ĠĠ", *specials]
    tokens += [f"<|unused_{i}|>" for i in range(vocab - len(tokens))]
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_string("tokenizer.ggml.pre", "qwen2")
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_array("tokenizer.ggml.token_type", [1] * 257 + [3] * len(specials) + [5] * (vocab - 257 - len(specials)))
    writer.add_array("tokenizer.ggml.merges", ["Ġ Ġ"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="GGUF file to write")
    ap.add_argument("--layers", type=int, default=4, help="trunk layers (every 4th is full attention)")
    ap.add_argument("--type", dest="recipe", default="q4_0", choices=sorted(RECIPES))
    ap.add_argument("--tiny", action="store_true", help="small widths (hidden 256) instead of the real 35B ones")
    ap.add_argument("--arch", default="qwen35moe", choices=ARCHES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mtp", action="store_true",
                    help="add the MTP block (blk.N.nextn.* and its attention layer), as llama.cpp writes it")
    ap.add_argument("--byte-tokenizer", action="store_true",
                    help="a byte-level vocabulary, so that `fermium up` serves the file (else none)")
    args = ap.parse_args()
    path = write_synthetic(args.out, layers=args.layers, recipe=args.recipe, widths=TINY if args.tiny else REAL,
                           seed=args.seed, arch=args.arch, byte_tokenizer=args.byte_tokenizer,
                           mtp=args.mtp)
    print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
