"""Structured output: response_format as a grammar for llguidance, and the matchers decode runs.

The router turns a request's `response_format` (compile_response_format) or a forced tool call
(common.tool_grammar) into a grammar spec, a string that travels in SamplingParams.grammar. Decode
builds a Matcher per sequence from it (with engine_tokenizer, built once per vocabulary), fills
the batch's allowed-token masks together before sampling (fill_masks) and feeds each sampled
token back. llguidance was chosen for its per-token mask cost on the 248k vocabulary
(tools/bench_grammar.py).

Not here: sampling (common.sampling) and parsing what the model wrote (services.router.frontend.chat).
"""
from __future__ import annotations

import re
import threading
from typing import Any, Iterable, Protocol

import llguidance as llg
import numpy as np

from .errors import UserError
from .sampling import MAX_GRAMMAR_CHARS

# one JSON layout, so a model cannot pad its answer with whitespace for ever
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")     # OpenAI's rule for json_schema.name


class GrammarError(UserError, ValueError):
    """A response_format or tool grammar that cannot be compiled; the message starts with the
    path of what is wrong, e.g. `response_format.json_schema.schema.properties.age.type: ...`."""


class Vocab(Protocol):
    """What a grammar needs of a tokenizer (common.model.tokenizer.Tokenizer has it)."""

    vocab_size: int
    eos_ids: set[int]

    def token_bytes(self, token_id: int) -> bytes: ...
    def is_special(self, token_id: int) -> bool: ...
    def encode(self, text: str) -> list[int]: ...
    def token_to_id(self, token: str) -> int | None: ...


# ---- response_format -> grammar spec --------------------------------------------------------
def compile_response_format(response_format: Any, tokenizer: Vocab | None = None) -> str:
    """OpenAI's `response_format` -> a grammar spec for SamplingParams.grammar; "" for text.

    `{"type": "json_object"}` is any JSON object; `{"type": "json_schema", "json_schema":
    {"name", "schema", "strict"}}` follows the schema, which is first checked against its
    metaschema (jsonschema) and then by llguidance (with `strict`, a keyword it cannot enforce
    is an error; without, it is ignored). Raises GrammarError naming the path."""
    where = "response_format"
    if response_format is None:
        return ""
    if not isinstance(response_format, dict):
        raise GrammarError(f"{where}: must be an object, got {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind == "text":
        return ""
    if kind == "json_object":
        return _json_grammar({"type": "object"}, strict=True, where=where, tokenizer=tokenizer)
    if kind != "json_schema":
        raise GrammarError(f"{where}.type: {kind!r} is not one of 'text', 'json_object', 'json_schema'")
    spec = response_format.get("json_schema")
    where += ".json_schema"
    if not isinstance(spec, dict):
        raise GrammarError(f"{where}: must be an object with 'name' and 'schema'")
    name, schema, strict = spec.get("name"), spec.get("schema", {}), spec.get("strict", False)
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise GrammarError(f"{where}.name: must be 1 to 64 letters, digits, '_' or '-', got {name!r:.80}")
    if not isinstance(strict, bool) and strict is not None:
        raise GrammarError(f"{where}.strict: must be a boolean, got {type(strict).__name__}")
    return _json_grammar(schema, strict=bool(strict), where=f"{where}.schema", tokenizer=tokenizer)


def check_schema(schema: Any, where: str) -> None:
    """The schema against its metaschema (Draft 2020-12 unless it names another in `$schema`)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise GrammarError(f"{where}: a JSON schema is an object or a boolean, got {type(schema).__name__}")
    try:
        import jsonschema
    except ImportError:                  # llguidance still checks what it compiles
        return
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(cls(cls.META_SCHEMA).iter_errors(schema))
    if error is None:
        return
    path = where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    bad_type = error.absolute_path and error.absolute_path[-1] == "type" and error.validator == "anyOf"
    raise GrammarError(f"{path}: {error.instance!r:.80} is not a JSON-schema type" if bad_type
                       else f"{path}: {error.message:.300}")


def _json_grammar(schema: Any, *, strict: bool, where: str, tokenizer: Vocab | None) -> str:
    check_schema(schema, where)
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(schema, overrides={**JSON_OPTIONS, "lenient": not strict})
        return validate(grammar, tokenizer, where)
    except GrammarError as e:
        raise GrammarError(_deeper(str(e), schema, where)) from None
    except ValueError as e:
        raise GrammarError(f"{where}: {e}") from None


_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \["([^"]+)"')
_FORMAT = re.compile(r"Unknown format: (\S+)")


def _deeper(message: str, schema: Any, where: str) -> str:
    """llguidance names a keyword, not its place: find where it is in the schema."""
    if m := _UNIMPLEMENTED.search(message):
        key, path = m.group(1), _find(schema, lambda d: m.group(1) in d)
        why = f"{key!r} cannot be enforced (without strict, it is ignored)"
    elif m := _FORMAT.search(message):
        key, path = "format", _find(schema, lambda d: d.get("format") == m.group(1))
        why = f"{m.group(1)!r} is not a known format"
    else:
        return message
    return message if path is None else f"{where}{path}.{key}: {why}"


def _find(node: Any, hit, path: str = "") -> str | None:
    """The path of the first map under `node` that `hit` accepts, e.g. '.properties.a'."""
    if isinstance(node, dict):
        if hit(node):
            return path
        items = ((f".{k}", v) for k, v in node.items())
    elif isinstance(node, list):
        items = ((f"[{i}]", v) for i, v in enumerate(node))
    else:
        return None
    for step, child in items:
        if (found := _find(child, hit, path + step)) is not None:
            return found
    return None


def validate(grammar: str, tokenizer: Vocab | None = None, where: str = "grammar") -> str:
    """The grammar back when llguidance compiles it and it fits SamplingParams, else GrammarError
    naming `where`."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"{where}: the grammar is {len(grammar)} characters, at most {MAX_GRAMMAR_CHARS} travel")
    tok = engine_tokenizer(tokenizer) if tokenizer is not None else None
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, tok, limits=QUIET)
    if is_error:
        raise GrammarError(f"{where}: {messages[0].split('<state>', 1)[0].strip()[:500]}")
    return grammar


def short_error(text: str) -> str:
    """llguidance's error while following a grammar, without the parser state it appends: its
    first line, cut (a compile error keeps its lines, which point into the grammar)."""
    first = text.strip().split("\n", 1)[0].split("<state>", 1)[0].strip()
    return (first[:300] or "the grammar engine failed")


def engine_error(m: llg.LLMatcher) -> str:
    return short_error(m.get_error() or "")


# ---- the tokenizer side, once per vocabulary ------------------------------------------------
class _Wrapper:
    """llguidance's TokenizerWrapper shape over a Vocab."""

    is_tokenizer_wrapper = True

    def __init__(self, vocab: Vocab, n_vocab: int):
        self.eos_token_id, self.bos_token_id = min(vocab.eos_ids), None
        self.tokens = [_bytes(vocab, i) for i in range(n_vocab)]
        self.special_token_ids = [i for i in range(min(n_vocab, vocab.vocab_size)) if vocab.is_special(i)]
        self._encode = vocab.encode

    def __call__(self, text: str) -> list[int]:
        return self._encode(text)


def _bytes(vocab: Vocab, i: int) -> bytes:
    try:
        return vocab.token_bytes(i)
    except ValueError:                       # padding beyond the tokenizer: never allowed
        return b""


QUIET = llg.LLParserLimits(verbose_errors=False)     # errors without the parser state and the grammar

_TOKENIZERS: dict[tuple[int, int], tuple[Vocab, llg.LLTokenizer]] = {}
_LOCK = threading.Lock()


def engine_tokenizer(vocab: Vocab, n_vocab: int | None = None) -> llg.LLTokenizer:
    """The llguidance tokenizer of `vocab` with `n_vocab` mask bits (the model's logits; default
    the vocabulary's size), built on the first call and kept for the process: it is the costly part."""
    n_vocab = n_vocab or vocab.vocab_size
    key = (id(vocab), n_vocab)
    with _LOCK:                                # a second caller waits for the first build
        hit = _TOKENIZERS.get(key)
        if hit is None or hit[0] is not vocab:
            hit = _TOKENIZERS[key] = (vocab, llg.LLTokenizer(_Wrapper(vocab, n_vocab), n_vocab=n_vocab,
                                                             eos_token=sorted(vocab.eos_ids)))
        return hit[1]


# ---- per sequence -----------------------------------------------------------------------------
class Matcher:
    """One sequence's place in its grammar."""

    def __init__(self, grammar: str, tokenizer: llg.LLTokenizer):
        self.m = llg.LLMatcher(tokenizer, grammar, log_level=0, limits=QUIET)
        if self.m.is_error():
            raise GrammarError(f"grammar: {engine_error(self.m)}")

    def consume(self, token: int) -> None:
        if not self.m.consume_token(token):
            raise GrammarError(f"grammar: token {token} does not continue it: {engine_error(self.m)}")

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more (but EOS)."""
        return self.m.is_stopped() and not self.m.is_error()


_EXECUTOR: llg.LLExecutor | None = None
PARALLEL_FROM = 8       # below, the executor's thread hand-off costs more than it spreads (tools/bench_grammar.py)


def fill_masks(matchers: Iterable[Matcher], n_vocab: int) -> np.ndarray:
    """Allowed-token bitmasks, (n, ceil(n_vocab / 32)) int32, bit t of row i for token t. A big
    batch fills them in llguidance's threads, without the GIL; a small one, one after the other."""
    global _EXECUTOR
    ms = [m.m for m in matchers]
    bitmask = np.zeros((len(ms), (n_vocab + 31) // 32), dtype=np.int32)
    row_bytes = bitmask.shape[1] * 4
    if len(ms) < PARALLEL_FROM:
        for i, m in enumerate(ms):
            m.unsafe_compute_mask_ptr(bitmask.ctypes.data + i * row_bytes, row_bytes)
    else:
        _EXECUTOR = _EXECUTOR or llg.LLExecutor()
        _EXECUTOR.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(ms)], bitmask.ctypes.data, row_bytes, len(ms))
    return bitmask


def allowed(bitmask_row: np.ndarray, n_vocab: int) -> np.ndarray:
    """One bitmask row -> (n_vocab,) bool."""
    return np.unpackbits(bitmask_row.view(np.uint8), bitorder="little")[:n_vocab].view(bool)
