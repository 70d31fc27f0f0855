"""The one error type of the converter: what is wrong, and with which file."""
from __future__ import annotations

from pathlib import Path


class ConvertError(Exception):
    """A checkpoint or an option that `fermium convert` cannot turn into a GGUF file."""

    def __init__(self, path: str | Path, what: str):
        self.path = Path(path)
        self.what = what
        super().__init__(f"{self.path}: {what}")
