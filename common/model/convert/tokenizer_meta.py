"""`tokenizer.ggml.*` fields from a checkpoint's tokenizer.json, as llama.cpp writes them.

Token types: 1 normal, 3 control (special added tokens, and added tokens that look like
`<|...|>`), 4 user-defined (other added tokens), 5 unused (ids the tokenizer does not
cover up to the model's vocab_size, written as `[PAD{id}]`). Merges, special token ids and
the chat template come from gguf-py's SpecialVocab (tokenizer.json, tokenizer_config.json,
generation_config.json, chat_template.jinja).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from gguf import GGUFWriter, SpecialVocab, TokenType

from .errors import ConvertError

log = logging.getLogger(__name__)


def _looks_special(token: str) -> bool:
    return token.startswith("<|") and token.endswith("|>")


def token_table(tokenizer_json: Path, vocab_size: int) -> tuple[list[str], list[int]]:
    try:
        data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
        vocab: dict[str, int] = dict(data["model"]["vocab"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ConvertError(tokenizer_json, f"not a BPE tokenizer.json ({exc})") from None
    added = {t["id"]: t for t in data.get("added_tokens", [])}
    for t in added.values():
        vocab[t["content"]] = t["id"]
    if max(vocab.values()) >= vocab_size:
        raise ConvertError(tokenizer_json, f"token id {max(vocab.values())} does not fit the "
                                           f"model's vocab_size {vocab_size}")
    by_id = {i: tok for tok, i in vocab.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        tok = by_id.get(i)
        if tok is None:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif i in added and (added[i].get("special") or _looks_special(tok)):
            tokens.append(tok)
            types.append(TokenType.CONTROL)
        elif i in added:
            tokens.append(tok.replace("\u2581", " "))
            types.append(TokenType.USER_DEFINED)
        else:
            tokens.append(tok)
            types.append(TokenType.NORMAL)
    return tokens, [int(t) for t in types]


def add_tokenizer(writer: GGUFWriter, src: Path, vocab_size: int, pre: str) -> bool:
    """Write the tokenizer if `src` has one; False (and a warning) if it has none."""
    path = src / "tokenizer.json"
    if not path.is_file():
        log.warning("%s: no tokenizer.json; the GGUF file will carry no tokenizer", src)
        return False
    tokens, types = token_table(path, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    SpecialVocab(src, load_merges=True, n_vocab=len(tokens)).add_to_gguf(writer, quiet=True)
    return True
