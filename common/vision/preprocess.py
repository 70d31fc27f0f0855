"""Image preprocessing for the Qwen3.5/3.6 vision tower, as transformers' Qwen2-VL image processor does it.

1. RGB, transparency composited onto white;
2. `smart_resize`: each side to a multiple of patch x merge (32), the pixel count within
   [min_pixels, max_pixels], the aspect ratio kept as closely as that allows; bicubic, with Pillow;
3. scaled to [0, 1] and normalised by the file's mean and std (0.5 and 0.5 for Qwen);
4. cut into patches in the tower's order: merge blocks in raster order, the patches of a block in
   raster order within it; each patch (channel, temporal, row, column), the still image repeated over
   the temporal patch of 2.

An image of H x W pixels after the resize gives (H/32) * (W/32) image tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from .config import VisionConfig

MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class Patches:
    pixels: np.ndarray           # [grid_h * grid_w, 3 * temporal * patch * patch] float32
    grid_h: int                  # in patches
    grid_w: int
    merge: int

    @property
    def token_rows(self) -> int:
        return self.grid_h // self.merge

    @property
    def token_cols(self) -> int:
        return self.grid_w // self.merge

    @property
    def n_tokens(self) -> int:
        return self.token_rows * self.token_cols

    def check(self, cfg: VisionConfig) -> None:
        """ValueError unless these patches are of the shape the tower of `cfg` takes."""
        if self.pixels.shape[1] != cfg.patch_dim or self.merge != cfg.merge_size:
            raise ValueError(f"patches of {self.pixels.shape[1]} values (merge {self.merge}); this tower "
                             f"takes {cfg.patch_dim} (merge {cfg.merge_size})")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) after the resize, each a multiple of `factor`."""
    if min(height, width) < 1:
        raise ValueError(f"an image of {width}x{height} pixels is empty")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"an image of {width}x{height} pixels has an aspect ratio over {MAX_ASPECT_RATIO}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def image_tokens(height: int, width: int, cfg: VisionConfig) -> int:
    """How many image tokens an image of height x width pixels becomes."""
    h, w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    return (h // cfg.factor) * (w // cfg.factor)


def preprocess(image: Image.Image, cfg: VisionConfig) -> Patches:
    image = to_rgb(image)
    h, w = smart_resize(image.height, image.width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    if (h, w) != (image.height, image.width):
        image = image.resize((w, h), resample=Image.Resampling.BICUBIC)
    # rescale in float64 then to float32, and normalise in float32, as transformers does
    x = (np.asarray(image, dtype=np.uint8).astype(np.float64) * (1 / 255)).astype(np.float32)   # [h, w, 3]
    x = (x - np.asarray(cfg.image_mean, np.float32)) / np.asarray(cfg.image_std, np.float32)
    return Patches(patchify(x.transpose(2, 0, 1), cfg), h // cfg.patch_size, w // cfg.patch_size, cfg.merge_size)


def patchify(chw: np.ndarray, cfg: VisionConfig) -> np.ndarray:
    """[3, h, w] -> [patches, 3 * temporal * P * P] in the tower's order."""
    c, h, w = chw.shape
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch
    gh, gw = h // p, w // p
    x = chw.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)   # [bh, bw, m, m, c, p, p]
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], t, p, p))               # the still repeated
    return np.ascontiguousarray(x.reshape(gh * gw, c * t * p * p), dtype=np.float32)
