"""--speculative mtp in serving: the in-process stack (router, prefill and decode servers) on a
synthetic model with an MTP block streams the same greedy text, finish reasons, usage and
logprobs as without it, for requests decoded together; the decode server ends each sequence
with the state and logits of plain decoding, and a grammar's sequence never drafts; decode's
metrics count the drafts; a model without an MTP block is refused at start; `fermium up`
passes the settings to decode; `fermium generate` prints the acceptance. The drafts favour
the plain greedy run's tokens (tests/speculative_helpers.OracleDrafts): random weights'
drafts are never accepted."""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from common.metrics import RouterMetrics
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from common.reference.model import ReferenceModel
from common.sampling import SamplingParams
from common.speculative import SpeculationError, Speculator
from fermium.local import LocalDispatcher
from services.decode.config import DecodeConfig
from services.decode.server import DecodeServer
from services.router.engine import Engine
from services.router.engine.admission import Admission
from services.router.frontend.api import API
from tests.speculative_helpers import OracleDrafts, plain_run
from tests.stack_helpers import each_reply, write_tiny_gguf
from tests.test_api_errors import lifespan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import TINY, write_synthetic  # noqa: E402

MODEL = "fermium"
PROMPTS = ["the quick", "a", "to be or not"]
MAX_TOKENS = 16
# the speculative decode verifies rows as decode does; a logprob's sum order may differ
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def mtp_file(tmp_path_factory):
    return write_synthetic(tmp_path_factory.mktemp("spec-serving") / "mtp.gguf", layers=4, recipe="f32",
                           widths=TINY, mtp=True, byte_tokenizer=True)


@pytest.fixture(scope="module")
def oracles(mtp_file):
    """The greedy runs of the prompts: the drafts guess them (random weights' drafts never agree)."""
    model = GGUFModel(mtp_file)
    tok, ref = Tokenizer.from_gguf(model), ReferenceModel(model)
    return [plain_run(ref, tok.encode(p), SamplingParams(), 2 * MAX_TOKENS)[0] for p in PROMPTS]


def app(path, oracles=None, **decode_settings):
    model = GGUFModel(path)
    tok = Tokenizer.from_gguf(model)
    runner = ReferenceModel(model)
    runner = OracleDrafts(runner, oracles) if oracles else runner
    dispatcher = LocalDispatcher(runner, prefill_runner=ReferenceModel(model), tokenizer=tok,
                                 decode_settings=decode_settings)
    engine = Engine(tok, dispatcher, Admission(4, 8), RouterMetrics(), 60.0)
    api = API(engine, served=(MODEL,), context=model.config.context_length, vocab=tok.vocab_size, encode=tok.encode,
              render=lambda msgs, kw: "".join(m["content"] for m in msgs))
    return api.app(lifespan=lifespan(dispatcher)), dispatcher


def answers(client, bodies) -> list[tuple]:
    """All requests at once, so decode batches them: (text, finish reason, usage, logprobs)."""
    def one(body):
        r = client.post("/v1/completions", json={"model": MODEL, "temperature": 0, **body})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        lp = choice["logprobs"]["token_logprobs"] if choice.get("logprobs") else None
        return choice["text"], choice["finish_reason"], r.json()["usage"]["completion_tokens"], lp

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


def bodies(path, oracles) -> list[dict]:
    """Each prompt; one with logprobs; one with a stop string that the greedy text meets at its 8th token."""
    stop = Tokenizer.from_gguf(GGUFModel(path)).decode(oracles[2][6:8])
    return ([{"prompt": p, "max_tokens": MAX_TOKENS} for p in PROMPTS]
            + [{"prompt": PROMPTS[0], "max_tokens": 5, "logprobs": 2},
               {"prompt": PROMPTS[2], "max_tokens": MAX_TOKENS, "stop": [stop]}])


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_stack_streams_what_the_plain_stack_streams(mtp_file, oracles, k):
    plain_app, _ = app(mtp_file)
    with TestClient(plain_app) as c:
        want = answers(c, bodies(mtp_file, oracles))
    spec_app, dispatcher = app(mtp_file, oracles, speculative="mtp", draft_tokens=k)
    with TestClient(spec_app) as c:
        got = answers(c, bodies(mtp_file, oracles))
        decode = dispatcher.servers[1]
        value = decode.metrics.registry.get_sample_value
        drafted = value("fermium_decode_spec_draft_tokens_total")
        accepted = value("fermium_decode_spec_accepted_tokens_total")
        rate = value("fermium_decode_spec_acceptance_rate")
        tokens = value("fermium_decode_tokens_total")
    for (text, reason, usage, lp), (w_text, w_reason, w_usage, w_lp) in zip(got, want):
        assert (text, reason, usage) == (w_text, w_reason, w_usage)
        if w_lp is not None:
            np.testing.assert_allclose(lp, w_lp, rtol=LOGPROB_TOL, atol=LOGPROB_TOL)
    assert want[-1][1] == "stop" and 0 < want[-1][2] < MAX_TOKENS
    assert 0 < accepted < drafted and rate == pytest.approx(accepted / drafted)
    assert tokens >= sum(u for _, _, u, _ in want)
    assert decode.speculator is not None and decode.memory.rollback_bytes == decode.runner.rollback_bytes(k)
    assert decode.memory.draft_kv_bytes == decode.runner.draft_state_bytes(decode.ctx_size)


def test_speculative_decoding_on_a_model_without_an_mtp_block_is_refused_at_start(tmp_path):
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(SpeculationError, match="needs a model with an MTP block"):
        DecodeServer(DecodeConfig(model=str(tiny), worker_token="t", speculative="mtp", runner="reference"))
    with pytest.raises(SpeculationError, match="--draft-tokens 4"):
        DecodeConfig(model=str(tiny), speculative="mtp", draft_tokens=4)


def test_up_passes_the_speculative_settings_to_decode(monkeypatch, mtp_file):
    from tests.stack_helpers import up_stack_kwargs
    seen = up_stack_kwargs(monkeypatch, model=mtp_file, speculative="mtp", draft_tokens=3, draft_vocab=300)
    flags = seen["extra"]["decode"]
    assert [flags[flags.index(f) + 1] for f in ("--speculative", "--draft-tokens", "--draft-vocab")] == \
        ["mtp", "3", "300"]


def test_generate_with_speculation_prints_the_same_tokens_and_the_acceptance(mtp_file):
    import json

    from tests.conftest import fermium_cli
    args = ["generate", "--model", mtp_file, "--prompt", PROMPTS[0], "--max-tokens", "10", "--runner", "reference"]
    plain = json.loads(fermium_cli(*args, "--json").stdout)
    spec = json.loads(fermium_cli(*args, "--json", "--speculative", "mtp", "--draft-tokens", "2",
                                  "--draft-vocab", "300").stdout)
    assert spec["tokens"] == plain["tokens"] and "speculative" not in plain
    drafts = spec["speculative"]
    assert drafts["drafted"] > 0 and drafts["acceptance_rate"] == drafts["accepted"] / drafts["drafted"]
    text = fermium_cli(*args, "--speculative", "mtp")
    assert "drafts accepted" in text.stderr.splitlines()[-1]
    refused = fermium_cli(*args[:2], str(write_tiny_gguf(Path(mtp_file).parent / "tiny.gguf")), *args[3:],
                          "--speculative", "mtp", check=False)
    assert refused.returncode == 2 and "needs a model with an MTP block" in refused.stderr


def decode_server_run(path, oracles, requests, **decode_settings):
    """The decode server alone, its link replaced: {rid: (tokens, Finished)} for DecodeRequests made
    from prefilled prompts, all admitted before the first step (one batch)."""
    from common.protocol.decode import DecodeRequest
    from common.protocol.router import Finished, Tokens
    model = GGUFModel(path)
    ref = ReferenceModel(model, kv_type="f32")
    runner = OracleDrafts(ReferenceModel(model, kv_type="f32"), oracles)
    server = DecodeServer(DecodeConfig(str(path), router="tcp://127.0.0.1:9", kv_type="f32", **decode_settings),
                          model=model, runner=runner)
    sent = []
    server.link.send, server.link.fail = sent.append, lambda rid, why: pytest.fail(f"{rid}: {why}")
    try:
        for rid, (prompt, params, max_tokens, stop_ids) in requests.items():
            state = ref.new_state()
            logits = ref.prefill(prompt, state)
            server.link._queue.put(DecodeRequest(rid, len(prompt), list(prompt), params, max_tokens, stop_ids, True,
                                                 state.arrays(), logits, "f32"))
        for _ in range(200):
            server.step(timeout=0)
            if not len(server.sched) and server.link._queue.empty():
                break
    finally:
        server.close()
    out = {rid: ([], None) for rid in requests}
    for m in each_reply(sent):
        if isinstance(m, Tokens):
            out[m.rid][0].extend(zip(m.tokens, m.logprobs or [None] * len(m.tokens)))
        elif isinstance(m, Finished):
            out[m.rid] = (out[m.rid][0], m)
    return out, server


def test_decode_server_ends_where_plain_decode_ends_with_its_state_and_logits(mtp_file, oracles, monkeypatch):
    tok = Tokenizer.from_gguf(GGUFModel(mtp_file))
    prompts = [tok.encode(p) for p in PROMPTS]
    greedy, lp = SamplingParams(), SamplingParams(logprobs=True, top_logprobs=2)
    requests = {"a": (prompts[0], greedy, MAX_TOKENS, []), "b": (prompts[1], lp, 7, []),
                "c": (prompts[2], greedy, MAX_TOKENS, [oracles[2][9]]),           # a stop id
                "d": (prompts[0], SamplingParams(temperature=0.8, seed=3), 9, []),
                "g": (prompts[1], SamplingParams(grammar='start: "to be"'), MAX_TOKENS, [])}
    want, _ = decode_server_run(mtp_file, oracles, requests)
    started = []
    start = Speculator.start

    def counted(self):
        started.append(1)
        return start(self)

    monkeypatch.setattr(Speculator, "start", counted)
    got, server = decode_server_run(mtp_file, oracles, requests, speculative="mtp", draft_tokens=3)
    assert len(started) == len(requests) - 1                  # the grammar's sequence never drafts
    assert tok.decode([t for t, _ in got["g"][0]]) == "to be" and got["g"][1].reason == "stop"
    for rid in requests:
        (w_tokens, w_end), (g_tokens, g_end) = want[rid], got[rid]
        if rid != "d":                    # sampled: only the distribution is kept, not the draws
            assert [t for t, _ in g_tokens] == [t for t, _ in w_tokens]
            np.testing.assert_allclose([p for _, p in g_tokens if p is not None],
                                       [p for _, p in w_tokens if p is not None], rtol=LOGPROB_TOL, atol=LOGPROB_TOL)
            assert (g_end.reason, g_end.n_generated, g_end.pos) == (w_end.reason, w_end.n_generated, w_end.pos)
            for a, b in zip([*g_end.recurrent, *g_end.k, *g_end.v], [*w_end.recurrent, *w_end.k, *w_end.v]):
                np.testing.assert_allclose(a, b, rtol=LOGPROB_TOL, atol=LOGPROB_TOL)
            np.testing.assert_allclose(g_end.logits, w_end.logits, rtol=LOGPROB_TOL, atol=LOGPROB_TOL)
        assert g_end.pos == len(requests[rid][0]) + g_end.n_generated - 1
    assert got["c"][1].reason == "stop" and got["b"][1].reason == "length"
    assert server.metrics.registry.get_sample_value("fermium_decode_spec_accepted_tokens_total") > 0
