"""Structured output in decode: a batch of sequences with different grammars (and one without)
runs the decode server's loop on random logits; every grammar's output parses and validates,
each ends with "stop" when its grammar is complete, the first token is masked too, and the
sequence without a grammar samples exactly what it samples alone."""
from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from common.grammar import compile_response_format
from common.model.default import default_model_path
from common.model.tokenizer import Tokenizer
from common.protocol.decode import DecodeRequest
from common.sampling import SamplingParams
from common.state import state_specs
from common.tool_grammar import tool_call_grammar
from services.decode.config import DecodeConfig
from services.decode.server import DecodeServer
from tests.stack_helpers import each_reply

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "ok": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
                         "pos": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -5,
                                                                        "maximum": 5}},
                                 "required": ["x"], "additionalProperties": False}},
          "required": ["name", "age", "ok", "tags", "pos"], "additionalProperties": False}
DIGITS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 6}
CHOICE = {"type": "object", "properties": {"pick": {"enum": ["a", "bb", "ccc"]}, "n": {"type": "null"}},
          "required": ["pick", "n"], "additionalProperties": False}
MOVE = {"type": "function", "function": {"name": "move", "parameters": {
    "type": "object", "properties": {"steps": {"type": "integer", "minimum": 1, "maximum": 20},
                                     "dir": {"enum": ["up", "down"]}},
    "required": ["steps", "dir"]}}}


class RandomRunner:
    """Logits that depend only on a sequence's own position and last token, so a sequence gets
    the same ones whatever else is in its batch."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def decode(self, tokens, states):
        out = np.empty((len(tokens), self.vocab), np.float32)
        for i, (token, state) in enumerate(zip(tokens, states)):
            out[i] = np.random.default_rng([state.pos, token]).normal(size=self.vocab) * 3
            state.pos += 1
        return out


def run(model, requests: dict[str, SamplingParams], max_tokens: int = 400, steps: int = 600, tokenizer=None,
        servers: list | None = None):
    """Each request decoded to its end; {rid: (tokens, finish reason)}. The server goes to `servers`."""
    cfg = model.config
    server = DecodeServer(DecodeConfig(str(default_model_path()), router="tcp://127.0.0.1:9", max_batch=8,
                                       kv_type="f32"), model=model, runner=RandomRunner(cfg.vocab_size),
                          tokenizer=tokenizer)
    if servers is not None:
        servers.append(server)
    sent = []
    server.link.send, server.link.fail = sent.append, lambda rid, why: pytest.fail(f"{rid}: {why}")
    state = [np.zeros(shape, dtype) for _, dtype, shape in state_specs(2, cfg, "f32")]
    eos = sorted((tokenizer or Tokenizer.from_gguf(model)).eos_ids)
    try:
        for rid, params in requests.items():
            first = np.random.default_rng(list(rid.encode())).normal(size=cfg.vocab_size).astype(np.float32) * 3
            server.link._queue.put(DecodeRequest(rid, 2, [5, 6], params, max_tokens, eos, False, state, first, "f32"))
        for _ in range(steps):
            server.step(timeout=0)
            if not len(server.sched) and server.link._queue.empty():
                break
    finally:
        server.close()
    tokens = {rid: [] for rid in requests}
    ends = {}
    for msg in each_reply(sent):
        if type(msg).__name__ == "Tokens":
            tokens[msg.rid] += msg.tokens
        elif type(msg).__name__ == "Finished":
            ends[msg.rid] = msg.reason
    return {rid: (tokens[rid], ends.get(rid)) for rid in requests}


def test_a_batch_of_grammars_always_gives_valid_output_and_a_plain_sequence_is_untouched(model, tok):
    fmt = {name: compile_response_format({"type": "json_schema", "json_schema": {"name": name, "schema": s,
                                                                                  "strict": True}}, tok)
           for name, s in (("person", PERSON), ("digits", DIGITS), ("choice", CHOICE))}
    plain = SamplingParams(temperature=1.0, seed=99)
    for seed in range(3):
        requests = {"person": SamplingParams(temperature=1.0, seed=seed, grammar=fmt["person"]),
                    "digits": SamplingParams(temperature=0.8, top_k=50, seed=seed, grammar=fmt["digits"]),
                    "choice": SamplingParams(temperature=1.0, top_p=0.9, seed=seed, grammar=fmt["choice"]),
                    "tool": SamplingParams(temperature=1.0, seed=seed, grammar=tool_call_grammar([MOVE], tok, "move")),
                    "plain": plain}
        out = run(model, requests, max_tokens=300)
        for rid, schema in (("person", PERSON), ("digits", DIGITS), ("choice", CHOICE)):
            ids, reason = out[rid]
            assert reason == "stop", (rid, tok.decode(ids))
            jsonschema.validate(json.loads(tok.decode(ids)), schema)
        ids, reason = out["tool"]
        text = tok.decode(ids)
        assert reason == "stop" and text.startswith("<tool_call>\n<function=move>\n<parameter=steps>\n"), text
        steps = int(text.split("<parameter=steps>\n")[1].split("\n")[0])
        assert 1 <= steps <= 20 and text.endswith("</function>\n</tool_call>")
        assert text.split("<parameter=dir>\n")[1].split("\n")[0] in ("up", "down")
        assert out["plain"] == run(model, {"plain": plain}, max_tokens=300)["plain"]


def test_the_first_token_is_masked_too(model, tok):
    spec = compile_response_format({"type": "json_object"}, tok)
    servers = []
    out = run(model, {"a": SamplingParams(grammar=spec), "b": SamplingParams()}, max_tokens=3, servers=servers)
    assert tok.decode(out["a"][0]).startswith("{")
    # one mask per token sampled with the grammar, the first token's included
    count = servers[0].metrics.registry.get_sample_value("fermium_decode_grammar_mask_seconds_count")
    assert count == len(out["a"][0])
    out = run(WithoutTokenizer(model), {"a": SamplingParams(grammar=spec)}, max_tokens=1, tokenizer=tok)
    assert tok.decode(out["a"][0]).startswith("{")                  # the in-process stack's way


class WithoutTokenizer:
    """The model file, less its vocabulary (as the synthetic models are)."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def has(self, key: str) -> bool:
        return not key.startswith("tokenizer.") and self._model.has(key)


def test_a_grammar_on_a_model_without_a_tokenizer_is_refused(model):
    cfg = model.config
    model = WithoutTokenizer(model)
    server = DecodeServer(DecodeConfig(str(default_model_path()), router="tcp://127.0.0.1:9", kv_type="f32"),
                          model=model, runner=RandomRunner(cfg.vocab_size))
    failed = []
    server.link.send, server.link.fail = (lambda m: None), lambda rid, why: failed.append(why)
    state = [np.zeros(shape, dtype) for _, dtype, shape in state_specs(2, cfg, "f32")]
    try:
        server.link._queue.put(DecodeRequest("g", 2, [5, 6], SamplingParams(grammar='start: "x"'), 4, [], False,
                                             state, np.zeros(cfg.vocab_size, np.float32), "f32"))
        server.step(timeout=0)
    finally:
        server.close()
    assert failed and "has no tokenizer" in failed[0]
