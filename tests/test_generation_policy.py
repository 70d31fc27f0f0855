"""One generation policy (common.generation): stop ids, stop strings across token boundaries,
max_tokens and finish reasons; and the same answer from `fermium generate`'s loop
(common.reference.generate.complete), the in-process stack (fermium.local) and real processes."""
from __future__ import annotations

import json

import httpx
import pytest
from starlette.testclient import TestClient

from common.generation import GenerationPolicy, StopStrings
from common.metrics import RouterMetrics
from common.model.chat_template import render_chat
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from common.reference.generate import complete, generate
from common.reference.model import ReferenceModel
from common.sampling import SamplingParams
from fermium.local import LocalDispatcher
from fermium.stack import Stack, free_port
from services.router.engine import Engine
from services.router.engine.admission import Admission
from services.router.frontend.api import API
from tests.stack_helpers import CHATML, write_tiny_gguf
from tests.test_api_errors import EOS, MODEL, ByteTokenizer, CountingRunner, lifespan, make_app

READY_TIMEOUT_S = 60


def fed(policy: GenerationPolicy, tokens: list[int], text=chr) -> str:
    """Feed tokens as a caller that detokenizes does; the text shown."""
    out = []
    for t in tokens:
        if policy.finished:
            break
        if policy.accept(t):
            out.append(policy.text(text(t)))
    return "".join(out) + policy.flush()


# ---- the policy

def test_a_stop_id_ends_unseen_and_counts():
    p = GenerationPolicy(10, stop_ids={EOS})
    assert fed(p, [ord("x"), ord("y"), EOS, ord("z")]) == "xy"
    assert (p.finish_reason, p.stop_reason, p.generated) == ("stop", EOS, 3)
    assert p.accept(ord("z")) is False and p.generated == 3          # nothing after the end


def test_max_tokens_emits_the_last_one():
    p = GenerationPolicy(3, stop_ids={EOS})
    assert [p.accept(t) for t in (1, 2, 3)] == [True, True, True]
    assert (p.finish_reason, p.stop_reason, p.generated) == ("length", None, 3)


def test_a_stop_id_on_the_last_token_is_stop():
    p = GenerationPolicy(2, stop_ids={EOS})
    assert [p.accept(t) for t in (1, EOS)] == [True, False]
    assert (p.finish_reason, p.generated) == ("stop", 2)


def test_a_stop_string_across_tokens_cuts_the_text():
    pieces = ["The c", "at s", "at on", " the mat"]
    p = GenerationPolicy(10, stop=["t sa", "mat"])
    shown = [p.text(piece) for piece in pieces if p.accept(0)]
    assert "".join(shown) == "The ca" and p.finish_reason == "stop" and p.stop_reason == "t sa"
    assert p.generated == 3                                  # the token that completed it counts
    assert shown[0] == "Th"                                  # a tail that may become "t sa" waits


def test_the_earliest_stop_string_wins_and_a_partial_one_is_shown_at_the_end():
    p = GenerationPolicy(10, stop=["cd", "bcd"])
    assert fed(p, list(b"abcde")) == "a" and p.stop_reason == "bcd" and p.generated == 4
    p = GenerationPolicy(3, stop=["xyz"])
    assert fed(p, list(b"wxy")) == "wxy" and p.finish_reason == "length"


def test_a_stop_string_on_the_last_token_is_stop():
    p = GenerationPolicy(3, stop=["cd"])
    assert fed(p, list(b"bcd")) == "b" and (p.finish_reason, p.generated) == ("stop", 3)


def test_stop_strings_hold_back_only_what_could_still_match():
    s = StopStrings(["abc"])
    assert s.feed("xxab") == ("xx", None) and s.feed("d") == ("a", None) and s.flush() == "bd"


# ---- the same answer three ways: the counting runner

CASES = [  # prompt, max_tokens, stop: (text, finish_reason, completion_tokens)
    ("w", 10, None, ("xyz", "stop", 4)),          # EOS after "z": not shown, counted
    ("y", 2, None, ("z", "stop", 2)),             # EOS as the max_tokens-th token
    ("a", 3, None, ("bcd", "length", 3)),
    ("a", 10, ["ef", "q"], ("bcd", "stop", 5)),   # "ef" ends on the 5th token
    ("a", 5, ["ef"], ("bcd", "stop", 5)),         # ... which is also the last
    ("a", 4, ["ef"], ("bcde", "length", 4)),      # "e" held back, then shown at the end
]


@pytest.fixture(scope="module")
def twin():
    with TestClient(make_app(LocalDispatcher(CountingRunner()))) as c:
        yield c


@pytest.mark.parametrize("prompt, max_tokens, stop, want", CASES)
@pytest.mark.parametrize("stream", [False, True])
def test_counting_answers_agree(twin, prompt, max_tokens, stop, want, stream):
    tok = ByteTokenizer()
    ref = complete(CountingRunner(), tok, tok.encode(prompt), SamplingParams(), max_tokens, {EOS}, stop or ())
    assert (ref.text, ref.finish_reason, ref.completion_tokens) == want
    assert answer(twin, dict(prompt=prompt, max_tokens=max_tokens, stop=stop), stream) == want


def test_generate_yields_no_stop_token():
    assert list(generate(CountingRunner(), list(b"w"), SamplingParams(), 10, {EOS})) == list(b"xyz")


def answer(client, body: dict, stream: bool) -> tuple[str, str, int]:
    """(text, finish_reason, completion_tokens) of one /v1/completions request."""
    body = {"model": MODEL, "temperature": 0, **{k: v for k, v in body.items() if v is not None}}
    if not stream:
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        r = r.json()
        return r["choices"][0]["text"], r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    return ("".join(c["text"] for c in choices), choices[-1]["finish_reason"],
            chunks[-1]["usage"]["completion_tokens"])


# ---- the same answer three ways: a real model file, and real processes

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("policy")
    return root, str(write_tiny_gguf(root / "tiny.gguf"))


def twin_app(path: str):
    model = GGUFModel(path)
    tok = Tokenizer.from_gguf(model)
    dispatcher = LocalDispatcher(ReferenceModel(model), prefill_runner=ReferenceModel(model))
    engine = Engine(tok, dispatcher, Admission(4, 4), RouterMetrics(), 30.0)
    api = API(engine, served=(MODEL,), context=model.config.context_length, vocab=tok.vocab_size,
              encode=tok.encode, render=lambda msgs, kw: render_chat(msgs, template=CHATML))
    return api.app(lifespan=lifespan(dispatcher))


def test_reference_twin_and_processes_agree(tiny):
    root, path = tiny
    model = GGUFModel(path)
    tok, reference = Tokenizer.from_gguf(model), ReferenceModel(model)
    ids = tok.encode("the cat")
    free = complete(reference, tok, ids, SamplingParams(), 12, tok.eos_ids)
    stop = free.text[4:7]                                   # one character a token: it spans three
    cases = [(12, None), (12, [stop]), (5, [free.text[3:9]])]
    want = [complete(reference, tok, ids, SamplingParams(), n, tok.eos_ids, s or ()) for n, s in cases]
    assert free.finish_reason == "length" and len(free.tokens) == 12 == len(free.text)
    assert want[0] == free and want[1].finish_reason == "stop" and want[1].text == free.text[:free.text.find(stop)]
    assert want[2].finish_reason == "length" and want[2].completion_tokens == 5
    want = [(c.text, c.finish_reason, c.completion_tokens) for c in want]
    bodies = [dict(prompt="the cat", max_tokens=n, stop=s) for n, s in cases]
    with TestClient(twin_app(path)) as c:
        assert [answer(c, b, stream) for b in bodies for stream in (False, True)] == [w for w in want for _ in "ab"]
    with Stack(path, port=free_port(), runner="reference", log_dir=root) as s:
        s.wait_ready(READY_TIMEOUT_S)
        with httpx.Client(base_url=s.url, timeout=30) as c:
            assert [answer(c, b, stream) for b in bodies for stream in (False, True)] == [w for w in want for _ in "ab"]
