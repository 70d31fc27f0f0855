"""The prefill worker's vision side (--mmproj): each image of a request through the vision
encoder, and the rows and mRoPE positions that its image tokens take (common/reference/multimodal.py).

The encoder is pluggable: the prefill backend's GPU encoder where it has one for the file (the cuda
backend's `vision_encoder(mmproj)`, backends/cuda_vision.py, which also decides whether the tower fits
its VRAM budget), else the native CPU encoder (native/vision_runner.py, `NativeVisionEncoder(mmproj)`)
where it exists and loads, else the numpy reference (common/reference/vision.py). The router has
already resized each image to whole image tokens (smart_resize); the pixels that arrive are
normalised and cut into patches here.
"""
from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

from common.reference.multimodal import ImageEmbedding, MropeInput, place_images, text_input
from common.vision.preprocess import preprocess
from common.vision.tensors import MmprojFile

log = logging.getLogger("fermium.prefill")
NATIVE_MODULE = "native.vision_runner"
ENCODERS = ("auto", "cuda", "native", "reference")


def load_encoder(mmproj: MmprojFile, name: str = "auto", backend: Any = None) -> tuple[str, Any]:
    """(name, encoder): anything with `encode(patches) -> (tokens, text hidden)`. `auto`: the
    backend's GPU encoder when it has one, else native when it loads, else reference."""
    if name not in ENCODERS:
        raise ValueError(f"no vision encoder named {name!r}; choose one of {', '.join(ENCODERS)}")
    gpu = getattr(backend, "vision_encoder", None)
    encoder = gpu(mmproj) if gpu is not None and name in ("auto", "cuda") else None
    if encoder is not None:
        return "cuda", encoder
    if name == "cuda":
        raise ValueError(f"no GPU vision encoder for {mmproj.path}: the prefill backend runs none (a cpu "
                         "backend, or a cuda one that placed the tower on the CPU)")
    if name in ("auto", "native") and importlib.util.find_spec(NATIVE_MODULE) is not None:
        try:
            from native.vision_runner import NativeVisionEncoder
            return "native", NativeVisionEncoder(mmproj)
        except Exception as e:
            if name == "native":
                raise
            log.warning("native vision encoder unavailable (%s: %s); running the reference encoder",
                        type(e).__name__, e)
    elif name == "native":
        raise ValueError(f"no native vision encoder ({NATIVE_MODULE} is not installed)")
    from common.reference.vision import VisionEncoder
    return "reference", VisionEncoder(mmproj)


class ImageRows:
    """Images -> their embeddings -> the rows and positions of one prefill request."""

    def __init__(self, mmproj: str | Path, encoder: str = "auto", metrics=None, backend: Any = None):
        """`backend`: the prefill backend, whose GPU encoder `auto` takes when it has one."""
        self.file = MmprojFile(mmproj)
        self.cfg = self.file.config
        self.encoder_name, self.encoder = load_encoder(self.file, encoder, backend)
        self.metrics = metrics
        log.info("vision: %s (%d blocks, %d wide), %s encoder", self.file.path.name, self.cfg.n_blocks,
                 self.cfg.hidden_size, self.encoder_name)

    def check_size(self, n: int, pixels: np.ndarray) -> None:
        h, w = pixels.shape[:2]
        f = self.cfg.factor
        if h % f or w % f or not self.cfg.min_pixels <= h * w <= self.cfg.max_pixels:
            raise ValueError(f"images[{n}] is {w}x{h} pixels: not whole {f}-pixel image tokens within "
                             f"[{self.cfg.min_pixels}, {self.cfg.max_pixels}] pixels (the router resizes them)")

    def embed(self, pixels: np.ndarray) -> ImageEmbedding:
        patches = preprocess(Image.fromarray(np.ascontiguousarray(pixels), "RGB"), self.cfg)
        t0 = time.perf_counter()
        rows = np.asarray(self.encoder.encode(patches), np.float32)
        if self.metrics is not None:
            self.metrics.encoder_time.observe(time.perf_counter() - t0)
            self.metrics.images.inc()
            self.metrics.image_tokens.inc(patches.n_tokens)
        return ImageEmbedding(patches.token_rows, patches.token_cols, rows)

    def place(self, tokens: Sequence[int], images: Sequence[np.ndarray], image_token: int,
              start_pos: int) -> MropeInput:
        """The MropeInput of `tokens` from rotary position `start_pos`, their images encoded."""
        for n, pixels in enumerate(images):
            self.check_size(n, pixels)
        return place_images(tokens, [self.embed(p) for p in images], image_token, start_pos=start_pos)


def segment(mm: MropeInput, a: int, b: int) -> MropeInput:
    """Rows [a, b) of a call's MropeInput, as a call of their own."""
    mine = (mm.rows >= a) & (mm.rows < b)
    next_pos = int(mm.rope_pos[0, b]) if b < mm.n_rows else mm.next_pos
    return MropeInput(mm.rope_pos[:, a:b], mm.rows[mine] - a, mm.embeds[mine], next_pos)


def request_rows(vision: ImageRows | None, tokens: Sequence[int], images: Sequence[np.ndarray] | None,
                 image_token: int, rope_pos: int, rope_delta: int) -> MropeInput | None:
    """What a request's tokens need beyond their ids: None for text from a state without images."""
    if images:
        if vision is None:
            raise ValueError("this prefill worker has no --mmproj, so it cannot take images")
        return vision.place(tokens, images, image_token, rope_pos)
    return text_input(rope_pos, len(tokens)) if rope_delta else None


def inside_image(mm: MropeInput | None, cut: int) -> bool:
    """Whether position `cut` of the call (0 < cut < rows) splits an image's rows: the rows on both
    sides are image rows, of one image (its rows share the T position)."""
    if mm is None or not len(mm.rows) or not np.isin([cut - 1, cut], mm.rows).all():
        return False
    return bool(mm.rope_pos[0, cut - 1] == mm.rope_pos[0, cut])
