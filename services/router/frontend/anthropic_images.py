"""Anthropic `image` blocks in user turns (with --mmproj):

    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "..."}}
    {"type": "image", "source": {"type": "url", "url": "https://..."}}   (only with --allow-image-urls)

anthropic_request.py puts each block in the chat body as an `ImageBlock`: an image part to the
messages code (services/router/frontend/messages.py), which hands it to the reader, and the block itself with
its place in the request. `AnthropicVision` is that reader: it reads the block through the same
checks and limits as an image_url part (images.py image_block, vision.py read_block), so a bad image
is a 400 that names `messages[i].content[j]` as the request has it, not as the translated body does.
"""
from __future__ import annotations

from typing import Sequence

from ..engine import PromptImage, PromptImages
from .errors import APIError, bad_request
from .vision import VisionInput

NO_VISION = "image blocks need a vision tower; this server was started without --mmproj"


class ImageBlock(dict):
    """An image part of the translated chat body that stands for the request's block at `where`."""

    def __init__(self, block: dict, where: str):
        super().__init__(type="image_url")
        self.block, self.where = block, where


def user_content(pieces: list, separator: str) -> str | list[dict]:
    """A user turn's text (str) and ImageBlock pieces -> its chat content: the text alone when it has
    no image, else parts, consecutive texts joined by `separator` as text blocks are."""
    if all(isinstance(p, str) for p in pieces):
        return separator.join(pieces)
    parts: list[dict] = []
    for p in pieces:
        if isinstance(p, str) and parts and parts[-1].get("type") == "text":
            parts[-1]["text"] += separator + p
        else:
            parts.append({"type": "text", "text": p} if isinstance(p, str) else p)
    return parts


class AnthropicVision:
    """The router's vision reader (None without --mmproj) for a translated Anthropic body."""

    def __init__(self, vision: VisionInput | None):
        self.vision = vision

    def read(self, part: dict, where: str) -> PromptImage:
        if not isinstance(part, ImageBlock):              # the translation makes every image part
            raise bad_request(f"{where}: only image blocks are read here", where)
        if self.vision is None:
            raise bad_request(f"{part.where}.type: {NO_VISION}", f"{part.where}.type")
        try:
            return self.vision.read_block(part.block, part.where)
        except APIError as e:       # the message names the block; so the error's path (anthropic_param)
            param = e.param if e.param and e.param in e.message else part.where
            raise APIError(e.status, e.message, type=e.type, param=param, code=e.code, headers=e.headers) from None

    def expand(self, ids: Sequence[int], images: Sequence[PromptImage]) -> tuple[list[int], PromptImages]:
        return self.vision.expand(ids, images)
