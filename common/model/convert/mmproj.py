"""`convert_mmproj(src, out, type)`: a Qwen3.5/3.6 checkpoint's vision tower (`model.visual.*`) to the
mmproj GGUF that llama.cpp's `convert_hf_to_gguf.py --mmproj` writes: architecture `clip`, projector
`qwen3vl_merger`, the `clip.vision.*` metadata and these tensors (numpy shapes, P the patch side):

- `v.patch_embd.weight`, `.weight.1`  (hidden, 3, P, P): the Conv3D's two temporal halves; `.bias` (hidden,)
- `v.position_embd.weight`            (n_pos, hidden): the learned grid, sqrt(n_pos) a side
- `v.blk.N.{ln1,ln2}`                 LayerNorm weight and bias (hidden,)
- `v.blk.N.attn_qkv`                  (3 hidden, hidden) + bias; `v.blk.N.attn_out` (hidden, hidden) + bias
- `v.blk.N.ffn_up` (ffn, hidden), `v.blk.N.ffn_down` (hidden, ffn), each + bias
- `v.post_ln`                         the merger's LayerNorm (hidden,), before the 2 x 2 merge
- `mm.0` (4 hidden, 4 hidden), `mm.2` (text hidden, 4 hidden): the merger's two Linears, + biases

Types as llama.cpp gives them: 1-D tensors and the position embedding stay F32; the patch embedding
is F16 in an f16 file and F32 otherwise; the rest take the file's type, a row that Q8_0 cannot hold
falling back to F16.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter
from gguf import GGUFValueType as V
from gguf.constants import GGML_QUANT_SIZES
from tqdm import tqdm

from .errors import ConvertError
from .hf_reader import VISION_NAME, Checkpoint
from .quantize import file_type, quantize, stored_nbytes
from .writer import ConvertResult, _umask

PROJECTOR_TYPE = "qwen3vl_merger"
MMPROJ_TYPES = ("f32", "f16", "bf16", "q8_0")       # the --outtype values llama.cpp's converter takes
VISION_MODEL_TYPES = ("qwen3_5_moe", "qwen3_5")
PREPROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")

_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)\.(weight|bias)$")
BLOCK_RULES = {"attn.qkv": "attn_qkv", "attn.proj": "attn_out", "mlp.linear_fc1": "ffn_up",
               "mlp.linear_fc2": "ffn_down", "norm1": "ln1", "norm2": "ln2"}
GLOBAL_RULES = {"merger.linear_fc1": "mm.0", "merger.linear_fc2": "mm.2", "merger.norm": "v.post_ln",
                "pos_embed": "v.position_embd"}


@dataclass(frozen=True)
class MmprojTensor:
    name: str
    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]


def _vision_config(ckpt: Checkpoint) -> dict:
    vision = ckpt.config.get("vision_config")
    if not vision:
        raise ConvertError(ckpt.src / "config.json", "no vision_config: the checkpoint has no vision tower")
    if ckpt.config.get("model_type") not in VISION_MODEL_TYPES:
        raise ConvertError(ckpt.src / "config.json", f"model_type {ckpt.config.get('model_type')!r} has no "
                                                     f"mmproj mapping; supported: {', '.join(VISION_MODEL_TYPES)}")
    if vision.get("deepstack_visual_indexes"):
        raise ConvertError(ckpt.src / "config.json", "deepstack_visual_indexes is set: deepstack mergers "
                                                     "(Qwen3-VL) are not supported, only Qwen3.5/3.6 towers")
    if int(vision.get("temporal_patch_size", 2)) != 2:
        raise ConvertError(ckpt.src / "config.json", "temporal_patch_size must be 2 (llama.cpp stores the "
                                                     "Conv3D as two Conv2D halves)")
    return vision


def _preprocessor(src: Path) -> dict:
    # as llama.cpp: preprocessor_config.json, then processor_config.json's image_processor over it
    merged: dict = {}
    for name in PREPROCESSOR_FILES:
        path = src / name
        if path.is_file():
            cfg = json.loads(path.read_text())
            merged |= cfg | cfg.get("image_processor", {}) | cfg.get("media_proc_cfg", {})
    for key in ("image_mean", "image_std"):
        if key not in merged:
            raise ConvertError(src, f"no {key} in {' or '.join(PREPROCESSOR_FILES)}: the mmproj needs the "
                                    "image normalisation")
    return merged


def mmproj_metadata(ckpt: Checkpoint, file_type_id: int) -> list[tuple[str, Any, V, V | None]]:
    """(key, value, type, array element type) in llama.cpp's order, after general.type and name."""
    vision, text = _vision_config(ckpt), ckpt.text_config
    pre = _preprocessor(ckpt.src)
    patch = int(vision["patch_size"])
    image_size = vision.get("image_size") or int(math.sqrt(vision.get("num_position_embeddings", 2304)) * patch)
    u32 = lambda k, v: (k, int(v), V.UINT32, None)  # noqa: E731
    depth = int(vision["depth"])
    out = [
        u32("general.file_type", file_type_id),
        ("clip.has_vision_encoder", True, V.BOOL, None),
        u32("clip.vision.projection_dim", text["hidden_size"]),
        u32("clip.vision.image_size", image_size),
        u32("clip.vision.patch_size", patch),
        u32("clip.vision.embedding_length", vision["hidden_size"]),
        u32("clip.vision.feed_forward_length", vision["intermediate_size"]),
        u32("clip.vision.block_count", depth),
        u32("clip.vision.attention.head_count", vision["num_heads"]),
        ("clip.vision.image_mean", [float(x) for x in pre["image_mean"]], V.ARRAY, V.FLOAT32),
        ("clip.vision.image_std", [float(x) for x in pre["image_std"]], V.ARRAY, V.FLOAT32),
        ("clip.projector_type", PROJECTOR_TYPE, V.STRING, None),
        ("clip.use_gelu", True, V.BOOL, None),
    ]
    if vision.get("spatial_merge_size") is not None:
        out.append(u32("clip.vision.spatial_merge_size", vision["spatial_merge_size"]))
    out += [
        # llama.cpp takes the LayerNorm eps from the text model's rms_norm_eps
        ("clip.vision.attention.layer_norm_epsilon", float(text.get("rms_norm_eps", 1e-6)), V.FLOAT32, None),
        ("clip.vision.is_deepstack_layers", [False] * depth, V.ARRAY, V.BOOL),
        ("general.quantization_version", GGML_QUANT_VERSION, V.UINT32, None),
    ]
    return out


def plan_mmproj(ckpt: Checkpoint) -> list[MmprojTensor]:
    """Output tensors in the checkpoint's order (as llama.cpp writes them)."""
    out: list[MmprojTensor] = []

    def add(name: str, hf: str, fn: Callable[[np.ndarray], np.ndarray] = lambda a: a,
            shape: tuple[int, ...] | None = None) -> None:
        out.append(MmprojTensor(name, shape or ckpt.shape(hf), lambda: fn(ckpt.get(hf))))

    for hf in ckpt.names():
        key = hf[len(VISION_NAME):]
        if m := _BLOCK.match(key):
            block, part, kind = m.groups()
            if part not in BLOCK_RULES:
                raise ConvertError(ckpt.src, f"vision tensor {hf} has no mmproj mapping")
            add(f"v.blk.{block}.{BLOCK_RULES[part]}.{kind}", hf)
        elif key == "patch_embed.proj.weight":             # (hidden, 3, 2, P, P) -> two (hidden, 3, P, P)
            c_out, c_in, kt, ph, pw = ckpt.shape(hf)
            for t, suffix in ((0, ""), (1, ".1")):
                add("v.patch_embd.weight" + suffix, hf, lambda a, t=t: np.ascontiguousarray(a[:, :, t]),
                    (c_out, c_in, ph, pw))
        elif key == "patch_embed.proj.bias":
            add("v.patch_embd.bias", hf)
        elif (stem := key.rsplit(".", 1))[0] in GLOBAL_RULES and stem[1] in ("weight", "bias"):
            add(f"{GLOBAL_RULES[stem[0]]}.{stem[1]}", hf)
        else:
            raise ConvertError(ckpt.src, f"vision tensor {hf} has no mmproj mapping")
    if not out:
        raise ConvertError(ckpt.src, "no model.visual.* tensors: the checkpoint has no vision tower")
    return out


def mmproj_type(name: str, shape: tuple[int, ...], out_type: str) -> GGMLQuantizationType:
    Q = GGMLQuantizationType
    if ".patch_embd.weight" in name:
        return Q.F16 if out_type == "f16" else Q.F32
    if len(shape) <= 1 or name.startswith("v.position_embd.") or not name.endswith(".weight"):
        return Q.F32
    q = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}[out_type]
    return q if shape[-1] % GGML_QUANT_SIZES[q][0] == 0 else Q.F16


def convert_mmproj(src: str | Path, out: str | Path, out_type: str = "f16", *, progress: bool = True,
                   name: str | None = None) -> ConvertResult:
    src, out = Path(src), Path(out)
    if out_type not in MMPROJ_TYPES:
        raise ConvertError("--type", f"an mmproj file is one of {', '.join(MMPROJ_TYPES)}, not {out_type!r}")
    ft = file_type(out_type)
    ckpt = Checkpoint(src, vision=True)
    meta = mmproj_metadata(ckpt, ft.ftype)
    tensors = plan_mmproj(ckpt)
    qtypes = [mmproj_type(t.name, t.shape, out_type) for t in tensors]
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=out.name + ".tmp-", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = GGUFWriter(tmp, "clip")
        writer.add_type("mmproj")
        writer.add_name(name or src.resolve().name)
        for key, value, vtype, sub in meta:
            writer.add_key_value(key, value, vtype, sub_type=sub)
        for t, q in zip(tensors, qtypes):
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), stored_nbytes(t.shape, q), raw_dtype=q)
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t, q in tqdm(list(zip(tensors, qtypes)), desc=f"mmproj {out.name}", unit="tensor",
                         disable=not progress):
            writer.write_tensor_data(np.ascontiguousarray(quantize(t.load(), q)))
        writer.close()
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    counts: dict[str, int] = {}
    for q in qtypes:
        counts[q.name] = counts.get(q.name, 0) + 1
    return ConvertResult(out, "clip", len(tensors), out.stat().st_size, counts, False)
