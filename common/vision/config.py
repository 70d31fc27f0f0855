"""The vision tower's configuration, read once from an mmproj GGUF's `clip.*` metadata.

The file says the widths; the rest is fixed by the projector type, as llama.cpp's clip graph for
`qwen3vl_merger` fixes it: the Conv3D's temporal patch of 2 (its two halves are two tensors), the
2D rotary's base 10000, and the 8 to 4096 image tokens that an image is resized into unless the
file names its own pixel limits.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from common.model.config import ModelConfigError

PROJECTOR_TYPES = ("qwen3vl_merger",)
TEMPORAL_PATCH = 2
VISION_ROPE_THETA = 10000.0
MIN_IMAGE_TOKENS, MAX_IMAGE_TOKENS = 8, 4096      # llama.cpp's limits for Qwen-VL projectors


@dataclass(frozen=True)
class VisionConfig:
    projector_type: str
    hidden_size: int
    ffn_size: int
    n_blocks: int
    n_heads: int
    patch_size: int
    merge_size: int              # spatial merge: merge x merge patches make one image token
    n_positions: int             # learned position grid: side x side
    projection_dim: int          # the text model's hidden size
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    eps: float
    min_pixels: int
    max_pixels: int
    temporal_patch: int = TEMPORAL_PATCH
    rope_theta: float = VISION_ROPE_THETA

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads

    @property
    def grid_side(self) -> int:
        return int(round(self.n_positions ** 0.5))

    @property
    def factor(self) -> int:
        """Image sides are multiples of this: one image token's pixels a side."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        return 3 * self.temporal_patch * self.patch_size * self.patch_size

    @classmethod
    def from_gguf_fields(cls, get: Callable[[str], Any], has: Callable[[str], bool], path: str | Path,
                         n_positions: int) -> "VisionConfig":
        def key(name: str, default: Any = None) -> Any:
            if has(name):
                return get(name)
            if default is not None:
                return default
            raise ModelConfigError(f"{path}: missing metadata key {name!r}, required for an mmproj file")

        arch = key("general.architecture")
        if arch != "clip":
            raise ModelConfigError(f"{path}: general.architecture is {arch!r}; an mmproj file is 'clip'")
        projector = key("clip.projector_type")
        if projector not in PROJECTOR_TYPES:
            raise ModelConfigError(f"{path}: clip.projector_type is {projector!r}; Fermium supports "
                                   f"{', '.join(PROJECTOR_TYPES)} (Qwen3.5/3.6)")
        if any(key("clip.vision.is_deepstack_layers", [False])):
            raise ModelConfigError(f"{path}: the tower has deepstack layers (Qwen3-VL); Fermium supports "
                                   "Qwen3.5/3.6 towers, which have none")
        if has("clip.use_silu") and get("clip.use_silu"):
            raise ModelConfigError(f"{path}: clip.use_silu is set; the {projector} tower's FFN is GELU")
        patch, merge = int(key("clip.vision.patch_size")), int(key("clip.vision.spatial_merge_size", 2))
        area = (patch * merge) ** 2
        hidden, heads = int(key("clip.vision.embedding_length")), int(key("clip.vision.attention.head_count"))
        if hidden % heads or (hidden // heads) % 4:
            raise ModelConfigError(f"{path}: {hidden} wide with {heads} heads: the 2D rotary needs a head "
                                   "width that is a multiple of 4")
        return cls(
            projector_type=projector,
            hidden_size=hidden,
            ffn_size=int(key("clip.vision.feed_forward_length")),
            n_blocks=int(key("clip.vision.block_count")),
            n_heads=heads,
            patch_size=patch,
            merge_size=merge,
            n_positions=n_positions,
            projection_dim=int(key("clip.vision.projection_dim")),
            image_mean=tuple(float(x) for x in key("clip.vision.image_mean")),
            image_std=tuple(float(x) for x in key("clip.vision.image_std")),
            eps=float(key("clip.vision.attention.layer_norm_epsilon", 1e-6)),
            min_pixels=int(key("clip.vision.image_min_pixels", MIN_IMAGE_TOKENS * area)),
            max_pixels=int(key("clip.vision.image_max_pixels", MAX_IMAGE_TOKENS * area)),
        )
