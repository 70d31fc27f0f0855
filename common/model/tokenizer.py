"""Byte-level BPE tokenizer, built with the `tokenizers` library from a GGUF file or a tokenizer.json.

A GGUF file carries the vocabulary as llama.cpp writes it: `tokenizer.ggml.tokens` (byte-level
strings, id = index), `tokenizer.ggml.merges` ("a b" pairs, highest priority first),
`tokenizer.ggml.token_type` and `tokenizer.ggml.pre`, the name of the split regex. The name is
looked up in PRE_TOKENIZERS; the regexes are the ones the model's own tokenizer.json declares.

Special (control) tokens: the library is set to read their strings as text, and `encode` cuts the
text at them itself (`split_specials`, `join`), so that a chat prompt's client text can be read as
text while the template's control tokens stay tokens (template_tokens.py) with one BPE model.

Not here: BPE itself (the library runs it) and the chat format (chat_template.py).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

from common.errors import UserError

from .detokenize import DetokenizeStream
from .token_budget import TokenBudget

# `tokenizer.ggml.pre` -> the split regex applied before byte-level BPE
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# qwen35 adds combining marks (\p{M}) to the letter runs and keeps them out of punctuation runs
_QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                 r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS: dict[str, str] = {
    "qwen35": _QWEN35_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Tokens that end a turn or the text in the Qwen family, beside the file's eos id.
END_TOKENS = ("<|im_end|>", "<|endoftext|>")


class TokenizerError(UserError, ValueError):
    """A vocabulary that cannot be turned into a tokenizer, with the reason in words."""


class MetadataSource(Protocol):
    """What from_gguf needs from a model file (GGUFModel satisfies it)."""

    def get(self, key: str): ...
    def has(self, key: str) -> bool: ...


def pre_tokenizer_name(pattern: str) -> str | None:
    """The `tokenizer.ggml.pre` name whose split regex is `pattern`, or None (for converters)."""
    return next((name for name, regex in PRE_TOKENIZERS.items() if regex == pattern), None)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted: char -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + i) for i, b in enumerate(shifted)})
    return {c: b for b, c in chars.items()}


_BYTE_DECODER = _byte_decoder()


def _byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], split: str) -> _HFTokenizer:
    tok = _HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


@dataclass(frozen=True)
class _Specials:
    eos_id: int | None
    bos_id: int | None
    add_bos: bool


class Tokenizer:
    """encode/decode over one vocabulary; `.stream()` for incremental detokenization."""

    def __init__(self, hf: _HFTokenizer, specials: _Specials, vocab_size: int | None = None,
                 chunkable: bool = False):
        self._hf = hf
        self._specials = specials
        self.vocab_size = vocab_size if vocab_size is not None else hf.get_vocab_size(with_added_tokens=True)
        ends = {self.token_to_id(t) for t in END_TOKENS} | {specials.eos_id}
        self.eos_ids: set[int] = {i for i in ends if i is not None}
        self._added = set(hf.get_added_tokens_decoder())
        self._special = {i for i, t in hf.get_added_tokens_decoder().items() if t.special}
        self._bytes: dict[int, bytes] = {}
        self._split = _special_splitter(hf)
        hf.encode_special_tokens = True     # the library reads them as text; encode() finds them itself
        # `chunkable`: the split regex is a PRE_TOKENIZERS one, whose safe cut points token_budget knows
        self.budget = TokenBudget(hf.get_vocab(with_added_tokens=True),
                                  [t.content for t in hf.get_added_tokens_decoder().values() if not t.special],
                                  set(_BYTE_DECODER), chunkable)

    # ---- construction
    @classmethod
    def from_gguf(cls, model: MetadataSource) -> "Tokenizer":
        kind = _get(model, "tokenizer.ggml.model")
        if kind != "gpt2":
            raise TokenizerError(f"tokenizer.ggml.model is {kind!r}; only 'gpt2' (byte-level BPE) is supported")
        pre = _get(model, "tokenizer.ggml.pre")
        if pre not in PRE_TOKENIZERS:
            raise TokenizerError(f"tokenizer.ggml.pre is {pre!r}; supported pre-tokenizers: "
                                 f"{', '.join(sorted(PRE_TOKENIZERS))}")
        tokens = list(_get(model, "tokenizer.ggml.tokens"))
        types = list(_get(model, "tokenizer.ggml.token_type")) if model.has("tokenizer.ggml.token_type") \
            else [TOKEN_NORMAL] * len(tokens)
        if len(types) != len(tokens):
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
        merges = [_split_merge(m) for m in _get(model, "tokenizer.ggml.merges")]

        vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)  # a duplicate string is unreachable by BPE; the first id wins
        hf = _byte_level_bpe(vocab, merges, PRE_TOKENIZERS[pre])
        # control tokens are special (skippable on decode); user-defined ones are plain text units
        hf.add_tokens([AddedToken(tokens[i], special=types[i] == TOKEN_CONTROL, normalized=False)
                       for i in range(len(tokens)) if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)])
        specials = _Specials(
            eos_id=_opt_id(model, "tokenizer.ggml.eos_token_id", len(tokens)),
            bos_id=_opt_id(model, "tokenizer.ggml.bos_token_id", len(tokens)),
            add_bos=bool(_get(model, "tokenizer.ggml.add_bos_token"))
            if model.has("tokenizer.ggml.add_bos_token") else False)
        return cls(hf, specials, vocab_size=len(tokens), chunkable=True)

    @classmethod
    def from_file(cls, path: str | Path) -> "Tokenizer":
        """A tokenizer.json; eos comes from tokenizer_config.json beside it when there is one."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        try:
            hf = _HFTokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception with a serde message
            raise TokenizerError(f"{path}: not a readable tokenizer.json ({exc})") from exc
        eos_id = None
        config = path.with_name("tokenizer_config.json")
        if config.is_file():
            eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
            eos = eos.get("content") if isinstance(eos, dict) else eos
            eos_id = hf.token_to_id(eos) if isinstance(eos, str) else None
        return cls(hf, _Specials(eos_id=eos_id, bos_id=None, add_bos=False))

    # ---- text <-> ids
    def encode(self, text: str, limit: int | None = None) -> list[int]:
        """`text`'s ids, each special (control) token's string in it taken as that token; past
        `limit` ids, token_budget.PromptTooLong, raised without tokenizing the rest."""
        if not isinstance(text, str):
            raise TypeError(f"Tokenizer.encode takes a str, got {type(text).__name__}")
        return self.with_bos(self.join(self.split_specials(text), self.room(limit)))

    def room(self, limit: int | None) -> int | None:
        """The ids that join() may give for a prompt of at most `limit`, BOS set aside."""
        return None if limit is None else limit - (self._specials.add_bos and self._specials.bos_id is not None)

    def split_specials(self, text: str) -> list[str]:
        """[text, special, text, ..., text]: `text` cut at its special tokens' strings, leftmost and
        longest first, as the library matches them."""
        return self._split.split(text) if self._split is not None else [text]

    def join(self, pieces: list[str], limit: int | None = None) -> list[int]:
        """The ids of split_specials' pieces: each special as its id, the texts between as text;
        at most `limit` of them (PromptTooLong past it)."""
        limit = None if limit is None else limit - len(pieces) // 2
        encoded = iter(self.encode_as_text([p for p in pieces[0::2] if p], limit))
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            if k % 2:
                ids.append(self._hf.token_to_id(piece))
            elif piece:
                ids += next(encoded)
        return ids

    def encode_as_text(self, texts: list[str], limit: int | None = None) -> list[list[int]]:
        """Each text's ids with special tokens' strings read as text (transformers'
        split_special_tokens; user-defined added tokens such as <think> still match), no BOS; past
        `limit` ids in all, PromptTooLong, refused by the bytes or partway (token_budget.py)."""
        if limit is not None:
            return self.budget.encode(self._batch, texts, limit)
        return self._batch(texts)

    def _batch(self, texts: list[str]) -> list[list[int]]:
        # encode_batch lets go of the GIL while it runs (encode does not), so other threads go on
        return [e.ids for e in self._hf.encode_batch(texts, add_special_tokens=False)]

    def with_bos(self, ids: list[int]) -> list[int]:
        """`ids` with the BOS token in front where the vocabulary asks for one."""
        if self._specials.add_bos and self._specials.bos_id is not None:
            ids.insert(0, self._specials.bos_id)
        return ids

    def special_strings(self) -> list[str]:
        """The text of every special (control) token."""
        return [t.content for t in self._hf.get_added_tokens_decoder().values() if t.special]

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        ids = self._check_ids(ids)
        return self._hf.decode(ids, skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._hf.id_to_token(token_id)

    def stream(self, *, skip_special: bool = False) -> DetokenizeStream:
        return DetokenizeStream(self, skip_special=skip_special)

    def save(self, path: str | Path) -> None:
        """Write the vocabulary as a tokenizer.json that from_file reads back."""
        self._hf.save(str(path))

    # ---- per-token bytes, for the stream
    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (possibly part of a UTF-8 character)."""
        cached = self._bytes.get(token_id)
        if cached is None:
            piece = self._hf.id_to_token(token_id)
            if piece is None:
                raise ValueError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})")
            if token_id in self._added or any(c not in _BYTE_DECODER for c in piece):
                cached = self._hf.decode([token_id], skip_special_tokens=False).encode("utf-8")
            else:
                cached = bytes(_BYTE_DECODER[c] for c in piece)
            self._bytes[token_id] = cached
        return cached

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        if isinstance(ids, (str, bytes)):
            raise TypeError("Tokenizer.decode takes a sequence of token ids, not text")
        ids = list(ids)
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.vocab_size:
                raise ValueError(f"invalid token id {i!r}: ids are ints in [0, {self.vocab_size})")
        return ids


def _special_splitter(hf: _HFTokenizer) -> re.Pattern | None:
    """The pattern that split_specials cuts at, or None without special tokens."""
    specials = [t for t in hf.get_added_tokens_decoder().values() if t.special]
    stripping = [t.content for t in specials if t.lstrip or t.rstrip or t.single_word]
    if stripping:
        raise TokenizerError(f"special tokens {stripping} strip whitespace or match single words; "
                             "only plain special tokens are supported")
    strings = sorted({t.content for t in specials}, key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, strings)) + ")") if strings else None


def _get(model: MetadataSource, key: str):
    if not model.has(key):
        raise TokenizerError(f"the model file has no {key}; it is needed to build the tokenizer")
    return model.get(key)


def _opt_id(model: MetadataSource, key: str, n_tokens: int) -> int | None:
    if not model.has(key):
        return None
    token_id = int(model.get(key))
    if not 0 <= token_id < n_tokens:
        raise TokenizerError(f"{key} is {token_id}, outside the vocabulary of {n_tokens} tokens")
    return token_id


def _split_merge(merge: str) -> tuple[str, str]:
    parts = merge.split(" ")
    if len(parts) != 2:
        raise TokenizerError(f"malformed merge {merge!r} in tokenizer.ggml.merges (expected 'left right')")
    return parts[0], parts[1]
