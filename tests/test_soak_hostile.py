"""The soak's hostile clients (tools/soak_hostile.py) against a real stack under the soak's router
deadlines: each gets the answer issue 42 asks for (a non-reader dropped, stalled bodies and slowloris
headers 408, a costly schema refused, forged control tokens and `n` > 1 served), and the soak counts
as failures exactly the outcomes it should."""
from __future__ import annotations

import random

import httpx
import pytest

from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from fermium.stack import Stack, free_port
from tools.soak import KINDS, weights
from tools.soak_hostile import HOSTILE, ROUTER_FLAGS, Target, failed

READY_TIMEOUT_S = 120
EXPECTED = {"non-reader": {"dropped"}, "stalled-body": {"408"}, "slowloris": {"408"},
            "costly-schema": {"400", "500 grammar budget"}, "forged-control": {"200"}, "n>1": {"200"}}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    model = str(default_model_path())
    eos = tuple(sorted(Tokenizer.from_gguf(GGUFModel(model)).eos_ids))
    with Stack(model, port=free_port(), runner="reference", log_dir=tmp_path_factory.mktemp("soak"),
               extra={"router": ROUTER_FLAGS}) as s:
        s.wait_ready(READY_TIMEOUT_S)
        yield Target(s.url, s.port, eos)


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_each_hostile_client_gets_its_answer(target, kind):
    with httpx.Client(base_url=target.url, timeout=60) as c:
        outcomes = [HOSTILE[kind][0](target, random.Random(seed), c) for seed in range(2)]
    assert set(outcomes) <= EXPECTED[kind], outcomes
    assert not any(failed(o) for o in outcomes)
    assert httpx.post(f"{target.url}/v1/completions", timeout=30,
                      json={"model": "fermium", "prompt": "the cat", "max_tokens": 2}).status_code == 200


def test_failures_are_the_5xx_but_the_grammar_budget_and_the_hangs():
    for outcome in (500, "503", "hang", "transport error (ReadTimeout)", "200 (error event)", "200 (no [DONE])",
                    "unanswered"):
        assert failed(outcome), outcome
    for outcome in (200, "400", "408", "dropped", "cancelled", "500 grammar budget", "200 (fit the buffers)", 429):
        assert not failed(outcome), outcome


def test_the_mix_takes_weights_over_the_defaults():
    mix = weights("near-limit=2,non-reader=0")
    assert mix["near-limit"] == 2 and mix["non-reader"] == 0 and mix["chat"] == KINDS["chat"]
    assert set(HOSTILE) <= set(KINDS)
    with pytest.raises(SystemExit):
        weights("nobody=1")
