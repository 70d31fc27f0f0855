"""Images in a prompt for the reference text model: which rows take the encoder's embeddings, and the
mRoPE positions (T, H, W) of every row, as transformers' Qwen3.5 get_rope_index gives them.

A prompt holds each image as a run of image tokens (`<|image_pad|>`) between `<|vision_start|>` and
`<|vision_end|>`, one per image token of the encoder's grid, row by row. Text rows have T = H = W = the
running position. An image's rows at running position s have T = s, H = s + row, W = s + col, and the
running position then advances by max(rows, cols), not by the row count: after an image, a row's
rotary position is its index in the sequence plus a delta (`MropeInput.next_pos` minus the rows so far),
which decode carries on with.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class ImageEmbedding:
    rows: int                    # image-token grid (patch grid / merge)
    cols: int
    embeds: np.ndarray           # [rows * cols, text hidden], row by row

    def __post_init__(self):
        if self.embeds.shape[0] != self.rows * self.cols:
            raise ValueError(f"{self.embeds.shape[0]} embeddings for a {self.rows} x {self.cols} image grid")


@dataclass(frozen=True)
class MropeInput:
    """What one forward call over T rows needs beyond the token ids."""
    rope_pos: np.ndarray         # [3, T] int64: (T, H, W) per row
    rows: np.ndarray             # [n] int64: the rows that take image embeddings, in order
    embeds: np.ndarray           # [n, hidden] float32
    next_pos: int                # the running position after these rows

    @property
    def n_rows(self) -> int:
        return self.rope_pos.shape[1]


def image_runs(tokens: Sequence[int], image_token: int) -> list[tuple[int, int]]:
    """(start, length) of each run of image tokens, in order."""
    ids = np.asarray(tokens)
    is_image = np.concatenate([[False], ids == image_token, [False]])
    edges = np.flatnonzero(is_image[1:] != is_image[:-1])
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2])]


def place_images(tokens: Sequence[int], images: Sequence[ImageEmbedding], image_token: int, *,
                 start_pos: int = 0, vision_start: int | None = None,
                 vision_end: int | None = None) -> MropeInput:
    """The rows, embeddings and positions of a prompt (or a piece of one starting at running position
    `start_pos`) whose image runs hold `images` in order. With `vision_start` / `vision_end`, each run
    must sit between them."""
    runs = image_runs(tokens, image_token)
    if len(runs) != len(images):
        raise ValueError(f"the prompt has {len(runs)} runs of image tokens for {len(images)} images")
    pos = np.empty((3, len(tokens)), np.int64)
    cursor, at = start_pos, 0
    rows, embeds = [], []
    for n, ((start, length), image) in enumerate(zip(runs, images)):
        if length != image.rows * image.cols:
            raise ValueError(f"image {n}: {length} image tokens for a {image.rows} x {image.cols} grid")
        if vision_start is not None and (start == 0 or tokens[start - 1] != vision_start):
            raise ValueError(f"image {n}: its image tokens do not follow a vision-start token")
        if vision_end is not None and (start + length >= len(tokens) or tokens[start + length] != vision_end):
            raise ValueError(f"image {n}: its image tokens are not followed by a vision-end token")
        pos[:, at:start] = np.arange(cursor, cursor + start - at)                # text before it
        cursor += start - at
        r, c = np.divmod(np.arange(length), image.cols)
        pos[0, start:start + length] = cursor
        pos[1, start:start + length] = cursor + r
        pos[2, start:start + length] = cursor + c
        cursor += max(image.rows, image.cols)
        rows.append(np.arange(start, start + length))
        embeds.append(np.asarray(image.embeds, np.float32))
        at = start + length
    pos[:, at:] = np.arange(cursor, cursor + len(tokens) - at)
    cursor += len(tokens) - at
    hidden = embeds[0].shape[1] if embeds else 0
    return MropeInput(pos, np.concatenate(rows) if rows else np.zeros(0, np.int64),
                      np.concatenate(embeds) if embeds else np.zeros((0, hidden), np.float32), cursor)


def text_input(start_pos: int, n: int) -> MropeInput:
    """n text rows from running position start_pos (decode after a prompt with images)."""
    pos = np.broadcast_to(np.arange(start_pos, start_pos + n), (3, n)).copy()
    return MropeInput(pos, np.zeros(0, np.int64), np.zeros((0, 0), np.float32), start_pos + n)


def mrope_rows(cfg, path, mm: MropeInput | None, n: int) -> np.ndarray | None:
    """mm's positions as (n, 3) int32 rows for a native prefill's `mrope` (of model `cfg`, file
    `path`), checked as the reference checks them; None for text alone."""
    if mm is None:
        return None
    if mm.n_rows != n:
        raise ValueError(f"mRoPE positions for {mm.n_rows} rows, the call has {n}")
    sections = cfg.rope_sections
    if len(sections) < 3 or sum(sections) != cfg.rope_dim // 2:
        raise ValueError(f"{path}: rope.dimension_sections is {list(sections)}; mRoPE for "
                         f"images needs sections that sum to {cfg.rope_dim // 2}")
    if len(mm.rows) and mm.embeds.shape != (len(mm.rows), cfg.hidden_size):
        raise ValueError(f"image embeddings of shape {list(mm.embeds.shape)}; the model takes "
                         f"[{len(mm.rows)}, {cfg.hidden_size}]")
    if len(mm.rows) and (mm.rows.min() < 0 or mm.rows.max() >= n):
        raise ValueError(f"image rows outside the call's {n} rows")
    if mm.rope_pos.min() < 0 or mm.rope_pos.max() >= 2 ** 31:
        raise ValueError("mRoPE positions outside [0, 2^31)")
    return np.ascontiguousarray(mm.rope_pos.T, np.int32)
