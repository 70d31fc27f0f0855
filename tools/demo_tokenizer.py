"""The demo model's tokenizer: a byte-level BPE with Qwen3.5/3.6's pre-tokenizer, trained on the
demo's text and chat mix, with the chat template's tags as single tokens, saved with Qwen3.6's
template in tokenizer_config.json."""
from __future__ import annotations

import json
import re
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

# control tokens (skipped when a client asks for special tokens to be skipped)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                  "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# tags the chat parsers read in the text: single tokens that decode as text, as in Qwen3.6's tokenizer
TEXT_TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
ADDED_TOKENS = SPECIAL_TOKENS + TEXT_TAGS
_ADDED_SPLIT = re.compile("|".join(re.escape(t) for t in ADDED_TOKENS))
# Qwen3.5/3.6's split pattern, so the GGUF pre-tokenizer type is the real model's
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEMPLATE = Path(__file__).resolve().parents[1] / "common/model/templates/qwen3_6.jinja"


def _without_added(texts: list[str]):
    # the BPE learns no merges across or inside the added tokens
    for text in texts:
        yield from (part for part in _ADDED_SPLIT.split(text) if part)


def train_tokenizer(texts: list[str], vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab - len(ADDED_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_without_added(texts), trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TEXT_TAGS])
    return tok


def save_tokenizer(tok: Tokenizer, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "special": t in SPECIAL_TOKENS, "lstrip": False,
                                       "rstrip": False, "normalized": False, "single_word": False}
             for t in ADDED_TOKENS}
    config = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768,
              "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "unk_token": None, "add_prefix_space": False, "added_tokens_decoder": added,
              "errors": "replace", "split_special_tokens": False,
              "chat_template": TEMPLATE.read_text(encoding="utf-8")}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
