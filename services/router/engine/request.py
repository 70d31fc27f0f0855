"""What the engine runs: a prompt in tokens, how to sample it and where to stop, and the prompt's
images (each image's pixels, its grid of image tokens and where that run starts), which prefill
encodes, the snapshot keys mark (common/snapshots/keys.py) and the rotary positions skip.
A frontend builds one from its dialect's request (frontend/schema.py `Job.request`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.sampling import SamplingParams


@dataclass(frozen=True)
class PromptImage:
    pixels: np.ndarray           # uint8 (height, width, 3), resized to whole image tokens
    rows: int                    # the image-token grid
    cols: int
    digest: bytes                # blake2b of the bytes the client sent

    @property
    def n_tokens(self) -> int:
        return self.rows * self.cols

    @property
    def rope_delta(self) -> int:
        """What the image moves the rotary position by, less its token count (<= 0)."""
        return max(self.rows, self.cols) - self.n_tokens


@dataclass(frozen=True)
class PromptImages:
    """A prompt's images and where their runs of image tokens start."""
    images: tuple[PromptImage, ...]
    starts: tuple[int, ...]
    image_token: int

    def marks(self) -> list[tuple[int, bytes]]:
        return [(s, im.digest) for s, im in zip(self.starts, self.images)]

    def inside(self, pos: int) -> bool:
        """Whether a prefix of `pos` tokens ends inside an image's run."""
        return any(s < pos < s + im.n_tokens for s, im in zip(self.starts, self.images))

    def rope_delta(self, pos: int) -> int:
        """The state's rope_delta after the first `pos` tokens (pos not inside an image)."""
        return sum(im.rope_delta for s, im in zip(self.starts, self.images) if s + im.n_tokens <= pos)

    def after(self, pos: int) -> list[np.ndarray]:
        """The pixels of the images whose runs start at or after `pos`."""
        return [im.pixels for s, im in zip(self.starts, self.images) if s >= pos]


@dataclass(frozen=True)
class Request:
    """One generation request, in tokens: `n` choices, each its own sequence from the one prefill."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()       # stop strings, applied to the text (generation.py)
    n: int = 1
    images: PromptImages | None = None
