"""OpenAI's shapes of the logprobs that each Delta carries (engine/ledger.py says which tokens'
they are), through common.logprobs.

In chat, every generated token has its entry in `logprobs.content`, reasoning and tool-call
tokens too, as vLLM reports them: the parser splits the text, not the tokens.
"""
from __future__ import annotations

from typing import Sequence

from common.logprobs import openai_logprobs

from ..engine import Entry


class Render:
    """OpenAI's `logprobs` of a choice or chunk; completions' text offsets run on from chunk to chunk."""

    def __init__(self, tokenizer, chat: bool):
        self.tokenizer, self.chat = tokenizer, chat
        self.offset = 0

    def text(self, token: int) -> str:
        return self.tokenizer.token_bytes(token).decode("utf-8", errors="replace")

    def __call__(self, got: Sequence[Entry]) -> dict:
        body = openai_logprobs([e[0] for e in got], [e[1] for e in got], [e[2] for e in got], self.text,
                               self.tokenizer.token_bytes, self.chat, self.offset)
        if not self.chat:
            self.offset += sum(len(t) for t in body["tokens"])
        return body
