"""A Hugging Face safetensors checkpoint, read one tensor at a time.

The safetensors header is parsed here (8-byte little-endian length, then JSON) so that a
truncated or missing shard is reported before any output is written, and so that bf16
tensors load without torch: each tensor is a view into a memory map, widened to float32
only when it is asked for.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ConvertError

INDEX_FILE = "model.safetensors.index.json"

# The multimodal wrapper keeps the text model under this prefix.
WRAPPER_PREFIX = "model.language_model."
# The MTP block: `mtp.*`, which some checkpoints keep as `model.mtp.*`
MTP_PREFIX, MTP_ALIAS = "mtp.", "model.mtp."
# The vision tower, which the mmproj file holds (common/model/convert/mmproj.py) and the text path skips.
VISION_PREFIXES = ("model.visual.", "visual.")
VISION_NAME = "visual."          # a vision tensor's name here: `visual.blocks.0.attn.qkv.weight`

_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "F64": np.dtype("<f8"),
}


@dataclass(frozen=True)
class TensorRef:
    file: Path
    key: str                     # the name inside the file
    dtype: str                   # safetensors dtype tag
    shape: tuple[int, ...]
    offset: int                  # absolute byte offset of the data in the file
    nbytes: int


def read_header(path: Path) -> dict[str, TensorRef]:
    """Tensor directory of one .safetensors file; raises ConvertError if it is cut short."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ConvertError(path, f"truncated safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise ConvertError(path, f"truncated safetensors file: header says {n} bytes, "
                                     f"file has {size - 8} after the length")
        try:
            header = json.loads(f.read(n))
        except ValueError as exc:
            raise ConvertError(path, f"corrupt safetensors header ({exc})") from None
    refs: dict[str, TensorRef] = {}
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ConvertError(path, f"tensor {key} has dtype {info['dtype']}; supported: "
                                     f"{', '.join(_DTYPES)}")
        start, stop = info["data_offsets"]
        end = max(end, stop)
        refs[key] = TensorRef(path, key, info["dtype"], tuple(info["shape"]), 8 + n + start,
                              stop - start)
    if 8 + n + end > size:
        raise ConvertError(path, f"truncated safetensors file: tensors need {8 + n + end} "
                                 f"bytes, the file has {size}")
    return refs


def load_config(src: Path) -> tuple[dict, dict]:
    """(full config.json, the text model's config) for plain and wrapper checkpoints."""
    path = src / "config.json"
    if not path.is_file():
        raise ConvertError(src, "no config.json: not a Hugging Face checkpoint directory")
    try:
        config = json.loads(path.read_text())
    except ValueError as exc:
        raise ConvertError(path, f"not valid JSON ({exc})") from None
    text = config.get("text_config") or config
    return config, text


class Checkpoint:
    """Tensors of a checkpoint directory, by their text-model names (`model.layers.0...`, and
    `mtp.*` for the MTP block); with `vision`, the vision tower's instead (`visual.*`)."""

    def __init__(self, src: str | Path, vision: bool = False):
        self.src = Path(src)
        self.vision = vision
        if not self.src.is_dir():
            raise ConvertError(self.src, "not a directory")
        self.config, self.text_config = load_config(self.src)
        self.refs: dict[str, TensorRef] = {}
        for shard in self._shards():
            for key, ref in read_header(shard).items():
                name = self._vision_name(key) if vision else self._text_name(key)
                if name is not None:
                    self.refs[name] = ref
        self._maps: dict[Path, np.memmap] = {}

    def _shards(self) -> list[Path]:
        index = self.src / INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            shards = sorted({self.src / f for f in weight_map.values()})
            for shard in shards:
                if not shard.is_file():
                    raise ConvertError(shard, f"missing shard named in {INDEX_FILE}")
            return shards
        shards = sorted(self.src.glob("*.safetensors"))
        if not shards:
            raise ConvertError(self.src, "no .safetensors files")
        return shards

    @staticmethod
    def _text_name(key: str) -> str | None:
        if key.startswith(WRAPPER_PREFIX):
            return "model." + key[len(WRAPPER_PREFIX):]
        if key.startswith(MTP_ALIAS):
            return MTP_PREFIX + key[len(MTP_ALIAS):]
        if key.startswith(VISION_PREFIXES):
            return None
        return key

    @staticmethod
    def _vision_name(key: str) -> str | None:
        for prefix in VISION_PREFIXES:
            if key.startswith(prefix):
                return VISION_NAME + key[len(prefix):]
        return None

    def __contains__(self, name: str) -> bool:
        return name in self.refs

    def names(self) -> list[str]:
        return list(self.refs)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.refs[name].shape

    def get(self, name: str, index: tuple | None = None) -> np.ndarray:
        """float32 copy of one tensor, or of `tensor[index]` (read from the map, not whole)."""
        ref = self.refs[name]
        mm = self._maps.get(ref.file)
        if mm is None:
            mm = self._maps[ref.file] = np.memmap(ref.file, dtype=np.uint8, mode="r")
        raw = mm[ref.offset:ref.offset + ref.nbytes].view(_DTYPES[ref.dtype]).reshape(ref.shape)
        if index is not None:
            raw = raw[index]
        if ref.dtype == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32)
