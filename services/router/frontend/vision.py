"""Images in chat prompts, on the router's side (--mmproj): each `image_url` part (or Anthropic
`image` block, read_block) decoded and held to the limits (images.py), resized to whole image
tokens as the vision tower's preprocessing does (common/vision/preprocess.py smart_resize), and its
place in the prompt.

The chat template sees each image as `<|vision_start|><|image_pad|><|vision_end|>`, as the
Qwen3.6 template renders an image part; after tokenizing, each image's one `<|image_pad|>`
becomes rows x cols of them, one per image token of its grid. The resized pixels go to prefill,
whose encoder turns them into those tokens' rows; the digest of each image's bytes keys its
snapshots (common/snapshots/keys.py marks), and the grids give the rotary delta after each image.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from PIL import Image

from common.reference.multimodal import image_runs
from common.vision.config import VisionConfig
from common.vision.preprocess import smart_resize
from common.vision.tensors import MmprojFile

from ..engine import PromptImage, PromptImages
from .errors import bad_request
from .images import DecodedImage, ImageLimits, image_block, image_part

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
IMAGE_TEXT = VISION_START + IMAGE_PAD + VISION_END     # an image in the rendered prompt, before expand()


class ImageReads:
    """chat_prompt's image reader: each image part read by `vision` (its read(part, where)) into
    `read`, in order, and written into the prompt's text as IMAGE_TEXT."""

    def __init__(self, vision):
        self.vision, self.read = vision, []

    def __call__(self, part: dict, where: str) -> str:
        self.read.append(self.vision.read(part, where))
        return IMAGE_TEXT


class VisionInput:
    """The router's reader of image parts for one vision tower."""

    def __init__(self, cfg: VisionConfig, token_to_id: Callable[[str], int | None],
                 limits: ImageLimits = ImageLimits(), fetch: Callable[[str, int], bytes] | None = None):
        self.cfg, self.limits, self.fetch = cfg, limits, fetch
        ids = {name: token_to_id(name) for name in (VISION_START, IMAGE_PAD, VISION_END)}
        missing = [name for name, i in ids.items() if i is None]
        if missing:
            raise ValueError(f"the model's tokenizer has no {', '.join(missing)}: it cannot take images")
        self.start_id, self.pad_id, self.end_id = ids[VISION_START], ids[IMAGE_PAD], ids[VISION_END]

    @classmethod
    def from_file(cls, mmproj: str | Path, token_to_id: Callable[[str], int | None], allow_urls: bool = False):
        from .images import fetch_url
        return cls(MmprojFile(mmproj).config, token_to_id, ImageLimits(allow_urls=allow_urls),
                   fetch_url if allow_urls else None)

    def read(self, part: dict, where: str) -> PromptImage:
        """One image_url part -> the resized image, or a 400 naming the part."""
        return self._resized(image_part(part, where, self.limits, self.fetch), where, f"{where}.image_url")

    def read_block(self, block: dict, where: str) -> PromptImage:
        """One Anthropic image block -> the resized image, or a 400 naming the block."""
        return self._resized(image_block(block, where, self.limits, self.fetch), where, f"{where}.source")

    def _resized(self, decoded: DecodedImage, where: str, param: str) -> PromptImage:
        width, height = decoded.size
        cfg = self.cfg
        try:
            h, w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
        except ValueError as e:
            raise bad_request(f"{where}: {e}", param, "invalid_image") from None
        image = decoded.image
        if (h, w) != (height, width):
            image = image.resize((w, h), resample=Image.Resampling.BICUBIC)
        return PromptImage(np.asarray(image, np.uint8), h // cfg.factor, w // cfg.factor,
                           bytes.fromhex(decoded.digest))

    def expand(self, ids: Sequence[int], images: Sequence[PromptImage]) -> tuple[list[int], PromptImages]:
        """The tokenized prompt with each image's one image token made its whole run."""
        singles = [i for i, t in enumerate(ids) if t == self.pad_id]
        if len(singles) != len(images):
            raise bad_request(f"the prompt holds {len(singles)} image tokens for {len(images)} images; "
                              f"{IMAGE_PAD} cannot be sent as text", "messages")
        out: list[int] = []
        at = 0
        for i, image in zip(singles, images):
            out += ids[at:i] + [self.pad_id] * image.n_tokens
            at = i + 1
        out += ids[at:]
        starts = tuple(s for s, _ in image_runs(out, self.pad_id))
        if len(starts) != len(images):
            raise bad_request(f"the prompt's image tokens run together: {len(starts)} runs for {len(images)} "
                              "images", "messages")
        return out, PromptImages(tuple(images), starts, self.pad_id)
