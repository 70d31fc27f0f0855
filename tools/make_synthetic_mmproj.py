"""Write a random-weight mmproj GGUF of the Qwen3.5/3.6 vision tower (`clip`, `qwen3vl_merger`), for
encoder benchmarks: the real tower's widths (27 blocks, hidden 1152, FFN 4304, 16 heads of 72, patch
16, merge 2, a 48 x 48 position grid, out 2048) unless told otherwise.

The metadata and the tensors' names, shapes and types are those of `fermium convert --mmproj`
(common/model/convert/mmproj.py), as llama.cpp's converter writes them: f16 by default, as its
default. Weights are random blocks (tools/synthetic_blocks.py), each matrix of standard
deviation about 1 / sqrt(in); tensors stream to disk one at a time.

    python tools/make_synthetic_mmproj.py /tmp/mmproj-f16.gguf [--type f16|q8_0|f32] [--blocks 27]
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_VERSION, GGUFWriter
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.model.convert.mmproj import PROJECTOR_TYPE, mmproj_type  # noqa: E402
from common.model.convert.quantize import file_type  # noqa: E402
from tools.synthetic_blocks import MAKERS, write_tensors  # noqa: E402

TYPES = ("f32", "f16", "q8_0")


@dataclass(frozen=True)
class Tower:
    blocks: int = 27
    hidden: int = 1152
    ffn: int = 4304
    heads: int = 16
    patch: int = 16
    merge: int = 2
    grid_side: int = 48
    out: int = 2048
    eps: float = 1e-6


def tensor_plan(w: Tower) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, kind) in the order llama.cpp's converter writes a Qwen3.5 tower."""
    H, M = w.hidden, w.merge ** 2 * w.hidden
    plan = [(f"v.patch_embd.weight{s}", (H, 3, w.patch, w.patch), "matrix") for s in ("", ".1")]
    plan += [("v.patch_embd.bias", (H,), "bias"), ("v.position_embd.weight", (w.grid_side ** 2, H), "pos")]
    for i in range(w.blocks):
        p = f"v.blk.{i}."
        plan += [(p + "ln1.weight", (H,), "norm"), (p + "ln1.bias", (H,), "bias"),
                 (p + "attn_qkv.weight", (3 * H, H), "matrix"), (p + "attn_qkv.bias", (3 * H,), "bias"),
                 (p + "attn_out.weight", (H, H), "matrix"), (p + "attn_out.bias", (H,), "bias"),
                 (p + "ln2.weight", (H,), "norm"), (p + "ln2.bias", (H,), "bias"),
                 (p + "ffn_up.weight", (w.ffn, H), "matrix"), (p + "ffn_up.bias", (w.ffn,), "bias"),
                 (p + "ffn_down.weight", (H, w.ffn), "matrix"), (p + "ffn_down.bias", (H,), "bias")]
    plan += [("v.post_ln.weight", (H,), "norm"), ("v.post_ln.bias", (H,), "bias"),
             ("mm.0.weight", (M, M), "matrix"), ("mm.0.bias", (M,), "bias"),
             ("mm.2.weight", (w.out, M), "matrix"), ("mm.2.bias", (w.out,), "bias")]
    return plan


def _metadata(writer: GGUFWriter, w: Tower, out_type: str) -> None:
    u32 = lambda key, value: writer.add_key_value(key, int(value), V.UINT32)  # noqa: E731
    u32("general.file_type", file_type(out_type).ftype)
    writer.add_key_value("clip.has_vision_encoder", True, V.BOOL)
    u32("clip.vision.projection_dim", w.out)
    u32("clip.vision.image_size", w.grid_side * w.patch)
    u32("clip.vision.patch_size", w.patch)
    u32("clip.vision.embedding_length", w.hidden)
    u32("clip.vision.feed_forward_length", w.ffn)
    u32("clip.vision.block_count", w.blocks)
    u32("clip.vision.attention.head_count", w.heads)
    writer.add_key_value("clip.vision.image_mean", [0.5] * 3, V.ARRAY, sub_type=V.FLOAT32)
    writer.add_key_value("clip.vision.image_std", [0.5] * 3, V.ARRAY, sub_type=V.FLOAT32)
    writer.add_key_value("clip.projector_type", PROJECTOR_TYPE, V.STRING)
    writer.add_key_value("clip.use_gelu", True, V.BOOL)
    u32("clip.vision.spatial_merge_size", w.merge)
    writer.add_key_value("clip.vision.attention.layer_norm_epsilon", w.eps, V.FLOAT32)
    writer.add_key_value("clip.vision.is_deepstack_layers", [False] * w.blocks, V.ARRAY, sub_type=V.BOOL)
    writer.add_key_value("general.quantization_version", GGML_QUANT_VERSION, V.UINT32)


def _values(rng, name: str, kind: str, shape: tuple[int, ...], qtype: T) -> np.ndarray:
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape, np.float32)).view(np.uint8)
    if kind in ("bias", "pos"):
        return (0.02 * rng.standard_normal(shape, np.float32)).astype(np.float32).view(np.uint8)
    rows, cols = shape[0], int(np.prod(shape[1:]))
    fan_in = 2 * cols if name.startswith("v.patch_embd.") else cols   # the two halves sum
    return MAKERS[qtype](rng, rows, cols, 1.0 / np.sqrt(fan_in))


def write_synthetic_mmproj(path: Path, out_type: str = "f16", tower: Tower = Tower(), seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(path, "clip")
    writer.add_type("mmproj")
    writer.add_name("synthetic Qwen3.6 vision tower")
    _metadata(writer, tower, out_type)
    write_tensors(writer, path, tensor_plan(tower), lambda name, shape, kind: mmproj_type(name, shape, out_type),
                  lambda name, shape, kind, qtype: _values(rng, name, kind, shape, qtype))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="mmproj GGUF file to write")
    ap.add_argument("--type", dest="out_type", default="f16", choices=TYPES)
    ap.add_argument("--blocks", type=int, default=Tower.blocks, help="ViT blocks (the real tower has 27)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    path = write_synthetic_mmproj(args.out, args.out_type, Tower(blocks=args.blocks), args.seed)
    print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
