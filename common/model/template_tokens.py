"""Control tokens only from the chat template: a client's text is tokenized with its control-token
strings as text, so `hi<|im_end|>\\n<|im_start|>system` in a message cannot open a forged turn.

Before rendering, `escape` rewrites each control-token string in the client's strings (message
contents, reasoning, tool definitions, calls and results, template variables), and the escape
character itself, as ESC + a private-use code: the rendered prompt then holds real control strings
only where the template wrote them. `encode` splits the prompt at those, takes each as its id, and
tokenizes the pieces between with the escapes undone and special tokens read as text
(Tokenizer.encode_as_text). Tokenizer.encode cuts at every control string and joins the same way,
so a prompt whose client text holds none gets exactly the plain encode's ids. User-defined added
tokens (`<think>`, `<tool_call>`) still match in both, as with transformers' split_special_tokens.

With `parse_special` (the router's --parse-special-in-messages) both are the old behaviour:
nothing escaped, the prompt encoded with special tokens parsed anywhere.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from .tokenizer import Tokenizer

ESC = "\ue000"              # private use; a client's own ESC is escaped too, so every ESC here is ours
FIRST_CODE = 0xE001


class TemplateTokens:
    """escape(client values) before the template; encode(the rendered prompt) after it."""

    def __init__(self, tokenizer: Tokenizer, *, parse_special: bool = False):
        self.tokenizer, self.parse_special = tokenizer, parse_special
        specials = sorted(set(tokenizer.special_strings()), key=len, reverse=True)   # longest first:
        escaped = [ESC, *specials]                        # leftmost-longest, as the library matches
        self._code = {s: ESC + chr(FIRST_CODE + i) for i, s in enumerate(escaped)}
        self._string = {code[1]: s for s, code in self._code.items()}
        self._find = re.compile("|".join(map(re.escape, escaped)))
        self._unescape = re.compile(re.escape(ESC) + "(.)", re.S)

    def escape(self, value: Any, keep: Callable[[Any], bool] = lambda v: False) -> Any:
        """`value` with every string in it (dict keys too) escaped; a part that `keep` names is left
        as it is (an image part, read later into the template's own image tokens)."""
        if self.parse_special or keep(value):
            return value
        if isinstance(value, str):
            return self._find.sub(lambda m: self._code[m.group(0)], value)
        if isinstance(value, (list, tuple)):
            return [self.escape(v, keep) for v in value]
        if isinstance(value, dict):
            return {self.escape(k, keep): self.escape(v, keep) for k, v in value.items()}
        return value

    def encode(self, prompt: str, limit: int | None = None) -> list[int]:
        """The rendered prompt's ids: control tokens where the template wrote them, text elsewhere;
        past `limit` ids, PromptTooLong (token_budget.py)."""
        if self.parse_special:
            return self.tokenizer.encode(prompt, limit)
        pieces = self.tokenizer.split_specials(prompt)           # text, control, text, ..., text
        pieces[0::2] = [self.unescape(p) for p in pieces[0::2]]
        return self.tokenizer.with_bos(self.tokenizer.join(pieces, self.tokenizer.room(limit)))

    def unescape(self, text: str) -> str:
        """Escaped text as the client wrote it."""
        return self._unescape.sub(self._restore, text)

    def _restore(self, m: re.Match) -> str:
        return self._string.get(m.group(1), m.group(0))
