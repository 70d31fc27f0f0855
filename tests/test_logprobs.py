"""Logprobs: what decode reports for each sampled token (the raw logits' log_softmax, against a
float64 reference), the first token's too, on the wire in DecodeStep's Tokens, and in OpenAI's shapes."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest

from common.logprobs import FLOOR, openai_logprobs, split_tops, token_logprobs
from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.protocol import ProtocolError, decode_frames, encode_message
from common.protocol.decode import DecodeRequest
from common.protocol.router import DecodeStep, Tokens
from common.sampling import Sampler, SamplingParams
from common.state import state_specs
from services.decode.config import DecodeConfig
from services.decode.server import DecodeServer
from tests.stack_helpers import each_reply

VOCAB = 248_320


def log_softmax(logits) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def check(logits, token: int, n: int) -> tuple[float, list[int], list[float]]:
    """token_logprobs against the float64 reference: the chosen token's, the true top n, sorted."""
    chosen, ids, values = token_logprobs(logits, token, n)
    want = log_softmax(logits)
    assert chosen == pytest.approx(want[token], abs=1e-6) and chosen <= 0
    assert len(ids) == len(values) == n
    assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
    np.testing.assert_allclose(values, want[ids], rtol=0, atol=1e-6)
    assert sorted(want[ids]) == sorted(np.sort(want)[::-1][:n])            # they are the n most likely
    return chosen, ids, values


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logprobs_are_the_log_softmax_of_the_raw_logits(dtype):
    rng = np.random.default_rng(0)
    for scale in (0.1, 3.0, 30.0):
        logits = (rng.normal(size=VOCAB) * scale).astype(dtype)
        for n in (0, 1, 5, 20):
            check(logits, int(rng.integers(VOCAB)), n)


def test_ties_go_to_the_lower_id_and_a_dead_token_gets_the_floor():
    logits = np.zeros(10, np.float32)
    logits[[7, 3]] = 2.0
    logits[9] = -np.inf
    chosen, ids, values = token_logprobs(logits, 9, 4)
    assert ids == [3, 7, 0, 1] and chosen == FLOOR and values[0] == values[1]
    nan = logits.copy()
    nan[5] = np.nan
    assert token_logprobs(nan, 5, 2)[0] == FLOOR and token_logprobs(nan, 5, 2)[1] == [3, 7]
    assert token_logprobs(np.full(4, -np.inf), 0, 2) == (FLOOR, [0, 1], [FLOOR, FLOOR])


def test_greedy_chooses_the_top_one():
    rng = np.random.default_rng(1)
    params = SamplingParams(logprobs=True, top_logprobs=5)
    for _ in range(5):
        logits = rng.normal(size=VOCAB).astype(np.float32) * 4
        token = Sampler(params).sample(logits)
        chosen, ids, values = check(logits, token, 5)
        assert ids[0] == token and chosen == values[0]


def test_logprobs_report_the_raw_logits_whatever_the_request_does_to_the_draw():
    logits = np.random.default_rng(2).normal(size=VOCAB).astype(np.float32)
    best = int(np.argmax(logits))
    params = SamplingParams(logprobs=True, top_logprobs=3, logit_bias={best: -100}, presence_penalty=2.0)
    token = Sampler(params).sample(logits, [best])
    chosen, ids, _ = check(logits, token, 3)
    assert token != best and ids[0] == best


@pytest.mark.parametrize("bad", [dict(logprobs=True, top_logprobs=21), dict(top_logprobs=3),
                                 dict(logprobs=True, top_logprobs=-1), dict(logprobs=1), dict(logprobs=True,
                                                                                            top_logprobs=2.0)])
def test_logprobs_parameters_out_of_bounds_are_refused(bad):
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(**bad)


def test_tokens_carry_logprobs_on_the_wire_and_bad_shapes_are_refused():
    seq = Tokens("r", [5, 9], [-0.5, -1.25], [5, 1, 9, 5], [-0.5, -2.0, -1.25, -1.5])
    msg = DecodeStep("", "d", [seq, Tokens("s", [5])])
    back = decode_frames(encode_message(msg))
    assert back == msg and split_tops(2, back.seqs[0].top_ids, back.seqs[0].top_logprobs) == [
        [(5, -0.5), (1, -2.0)], [(9, -1.25), (5, -1.5)]]
    assert back.seqs[1].logprobs == []
    for fields in (([5, 9], [-0.5], [], []), ([5], [], [1], [-1.0]), ([5], [-0.5], [1, 2], [-1.0]),
                   ([5, 9], [-0.5, -1.0], [1, 2, 3], [-1.0, -2.0, -3.0]),
                   ([5], [-0.5], list(range(21)), [-1.0] * 21)):
        with pytest.raises(ProtocolError, match="Tokens"):
            Tokens("r", *fields)
    header = msgpack.unpackb(encode_message(msg)[0])
    header["f"]["seqs"][0]["logprobs"] = [-0.5, float("-inf")]
    with pytest.raises(ProtocolError, match="finite"):
        decode_frames([msgpack.packb(header)])
    header["f"]["seqs"][0]["logprobs"] = [-0.5, "x"]
    with pytest.raises(ProtocolError, match="finite"):
        decode_frames([msgpack.packb(header)])


class RowRunner:
    """Logits that depend only on position and last token, so the test can make them again."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def row(self, pos: int, token: int) -> np.ndarray:
        return np.random.default_rng([pos, token]).normal(size=self.vocab).astype(np.float32) * 3

    def decode(self, tokens, states):
        out = np.stack([self.row(s.pos, t) for t, s in zip(tokens, states)])
        for s in states:
            s.pos += 1
        return out


@pytest.mark.parametrize("params", [SamplingParams(logprobs=True, top_logprobs=4),
                                    SamplingParams(temperature=0.8, top_p=0.9, seed=3, logprobs=True, top_logprobs=2),
                                    SamplingParams(logprobs=True), SamplingParams()])
def test_decode_sends_each_tokens_logprobs_the_first_one_included(params):
    model = GGUFModel(default_model_path())
    cfg = model.config
    runner = RowRunner(cfg.vocab_size)
    server = DecodeServer(DecodeConfig(str(default_model_path()), router="tcp://127.0.0.1:9", kv_type="f32"),
                          model=model, runner=runner)
    sent = []
    server.link.send, server.link.fail = sent.append, lambda rid, why: pytest.fail(why)
    state = [np.zeros(shape, dtype) for _, dtype, shape in state_specs(2, cfg, "f32")]
    first = runner.row(99, 99)
    try:
        server.link._queue.put(DecodeRequest("r", 2, [5, 6], params, 6, [], False, state, first, "f32"))
        for _ in range(20):
            server.step(timeout=0)
    finally:
        server.close()
    tokens = [m for m in each_reply(sent) if isinstance(m, Tokens)]
    assert len(tokens) == 6
    rows, pos = [first], 2
    for m in tokens[:-1]:
        rows.append(runner.row(pos, m.tokens[0]))
        pos += 1
    for m, logits in zip(tokens, rows):
        if not params.logprobs:
            assert m.logprobs == m.top_ids == m.top_logprobs == []
            continue
        chosen, ids, values = check(logits, m.tokens[0], params.top_logprobs)
        assert (m.logprobs, m.top_ids, m.top_logprobs) == ([chosen], ids, values)
        if params.temperature == 0 and ids:
            assert ids[0] == m.tokens[0]


TEXT = {1: "Hel", 2: "lo", 3: " w", 4: "\ufffd"}
BYTES = {1: b"Hel", 2: b"lo", 3: b" w", 4: b"\xe4"}


def test_openai_shapes_for_chat_and_completions():
    ids, lps = [1, 2, 4], [-0.1, -0.2, -3.0]
    tops = [[(1, -0.1), (3, -2.5)], [(2, -0.2), (1, -1.0)], [(2, -1.0), (4, -3.0)]]
    chat = openai_logprobs(ids, lps, tops, TEXT.get, BYTES.get, chat=True)
    assert chat == {"content": [
        {"token": "Hel", "logprob": -0.1, "bytes": [72, 101, 108],
         "top_logprobs": [{"token": "Hel", "logprob": -0.1, "bytes": [72, 101, 108]},
                          {"token": " w", "logprob": -2.5, "bytes": [32, 119]}]},
        {"token": "lo", "logprob": -0.2, "bytes": [108, 111],
         "top_logprobs": [{"token": "lo", "logprob": -0.2, "bytes": [108, 111]},
                          {"token": "Hel", "logprob": -1.0, "bytes": [72, 101, 108]}]},
        {"token": "\ufffd", "logprob": -3.0, "bytes": [0xe4],
         "top_logprobs": [{"token": "lo", "logprob": -1.0, "bytes": [108, 111]},
                          {"token": "\ufffd", "logprob": -3.0, "bytes": [0xe4]}]}]}
    completion = openai_logprobs(ids, lps, tops, TEXT.get, BYTES.get, chat=False, text_offset=10)
    assert completion == {"tokens": ["Hel", "lo", "\ufffd"], "token_logprobs": [-0.1, -0.2, -3.0],
                          "top_logprobs": [{"Hel": -0.1, " w": -2.5}, {"lo": -0.2, "Hel": -1.0},
                                           {"lo": -1.0, "\ufffd": -3.0}],
                          "text_offset": [10, 13, 15]}
    assert openai_logprobs([], [], [], TEXT.get, BYTES.get, chat=True) == {"content": []}
    with pytest.raises(ValueError, match="aligned"):
        openai_logprobs(ids, lps[:2], tops, TEXT.get, BYTES.get, chat=False)


def test_a_repeated_text_among_the_top_keeps_the_likelier():
    out = openai_logprobs([1], [-0.5], [[(1, -0.5), (5, -0.7)]], lambda t: "same", lambda t: b"s", chat=False)
    assert out["top_logprobs"] == [{"same": -0.5}]
