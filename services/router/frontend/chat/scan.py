"""Tag search over streamed text: where the next tag is, and how much of the end may still begin one."""
from __future__ import annotations

from collections.abc import Sequence


def find_first(text: str, tags: Sequence[str], start: int = 0) -> tuple[int, str | None]:
    """The earliest complete tag in text[start:] and where it begins; (-1, None) when there is none.
    On a tie the longer tag wins."""
    best, found = -1, None
    for tag in tags:
        i = text.find(tag, start)
        if i >= 0 and (best < 0 or i < best or (i == best and len(tag) > len(found))):
            best, found = i, tag
    return best, found


def partial_suffix(text: str, tags: Sequence[str]) -> int:
    """Length of the longest end of `text` that is a proper prefix of one of `tags`: what a stream
    must hold back, because the next delta may complete it."""
    longest = min(len(text), max(len(tag) for tag in tags) - 1)
    for k in range(longest, 0, -1):
        end = text[-k:]
        if any(len(tag) > k and tag.startswith(end) for tag in tags):
            return k
    return 0


def is_partial(text: str, tags: Sequence[str]) -> bool:
    """Whether `text` is a proper prefix of one of `tags`."""
    return any(len(tag) > len(text) and tag.startswith(text) for tag in tags)
