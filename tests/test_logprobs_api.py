"""logprobs, top_logprobs, logit_bias and the presence and frequency penalties through the API, on
the real stack (router, prefill, decode as processes, the demo model) with the official openai
client: the shapes of chat and completions, streamed alike, the chosen token the top one when
greedy, a bias that forbids or forces a token, penalties that break a greedy loop, and the 400s."""
from __future__ import annotations

import httpx
import pytest

from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from tests.test_n_choices import client, stack  # noqa: F401  (the module's fixtures)

MAX_TOKENS = 10
TOP = 5
LONG = 40                   # tokens enough for a greedy answer to repeat some
PROMPT = "The list of numbers goes on and on:"


@pytest.fixture(scope="module")
def model(client):  # noqa: F811
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_gguf(GGUFModel(str(default_model_path())))


def chat(client, model, **kw):  # noqa: F811
    kw = {"max_tokens": MAX_TOKENS, "temperature": 0, **kw}
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}], **kw)


def complete(client, model, **kw):  # noqa: F811
    return client.completions.create(model=model, prompt=PROMPT, **{"max_tokens": MAX_TOKENS, "temperature": 0, **kw})


def entries(content) -> list[tuple]:
    return [(e.token, e.logprob, tuple(e.bytes), tuple((t.token, t.logprob) for t in e.top_logprobs)) for e in content]


def test_chat_logprobs_are_sorted_and_the_greedy_token_is_the_top_one(client, model):  # noqa: F811
    r = chat(client, model, logprobs=True, top_logprobs=TOP)
    content = r.choices[0].logprobs.content
    # the end-of-sequence token counts in usage but has no text, and so no entry
    assert r.usage.completion_tokens - 1 <= len(content) <= r.usage.completion_tokens
    for e in content:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == TOP and tops == sorted(tops, reverse=True) and all(v <= 0 for v in tops)
        assert e.logprob <= 0 and e.token == e.top_logprobs[0].token and e.logprob == pytest.approx(tops[0])
        assert bytes(e.bytes).decode("utf-8", errors="replace") == e.token
    message = r.choices[0].message
    shown = "".join(e.token for e in content)
    # reasoning tokens have their entries too, as in vLLM
    assert (message.content or "") in shown


def test_logprobs_without_tops_and_none_unless_asked(client, model):  # noqa: F811
    r = chat(client, model, logprobs=True)
    assert r.choices[0].logprobs.content and all(e.top_logprobs == [] for e in r.choices[0].logprobs.content)
    assert chat(client, model).choices[0].logprobs is None
    assert complete(client, model).choices[0].logprobs is None


def test_chat_streamed_logprobs_equal_the_whole(client, model):  # noqa: F811
    whole = entries(chat(client, model, logprobs=True, top_logprobs=3).choices[0].logprobs.content)
    streamed = []
    for chunk in chat(client, model, logprobs=True, top_logprobs=3, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += entries(chunk.choices[0].logprobs.content)
    assert [e[0] for e in streamed] == [e[0] for e in whole] and [e[2] for e in streamed] == [e[2] for e in whole]
    assert [e[1] for e in streamed] == pytest.approx([e[1] for e in whole], abs=1e-4)
    assert [[t[0] for t in e[3]] for e in streamed] == [[t[0] for t in e[3]] for e in whole]


def test_completions_logprobs_shape_and_offsets(client, model):  # noqa: F811
    r = complete(client, model, logprobs=3)
    lp, text = r.choices[0].logprobs, r.choices[0].text
    n = len(lp.tokens)
    assert r.usage.completion_tokens - 1 <= n <= r.usage.completion_tokens
    assert n == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert "".join(lp.tokens) == text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(n)]
    for chosen, tops, token in zip(lp.token_logprobs, lp.top_logprobs, lp.tokens):
        assert 1 <= len(tops) <= 3 and chosen <= 0 and max(tops.values()) == pytest.approx(chosen)
        assert tops[token] == pytest.approx(chosen)
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in complete(client, model, logprobs=3, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            for key in streamed:
                streamed[key] += getattr(chunk.choices[0].logprobs, key)
    assert streamed == {key: getattr(lp, key) for key in streamed}


def test_a_stop_string_trims_the_logprobs(client, model):  # noqa: F811
    full = complete(client, model, logprobs=0).choices[0]
    cut = full.text[len(full.text) // 2:][:2]
    assert cut.strip(), full.text
    for stream in (False, True):
        tokens, text = [], ""
        if stream:
            for chunk in complete(client, model, logprobs=0, stop=[cut], stream=True):
                if chunk.choices:
                    text += chunk.choices[0].text
                    tokens += chunk.choices[0].logprobs.tokens if chunk.choices[0].logprobs else []
        else:
            r = complete(client, model, logprobs=0, stop=[cut]).choices[0]
            tokens, text = r.logprobs.tokens, r.text
        assert text == full.text[:full.text.index(cut)]
        joined = "".join(tokens)
        # the tokens that show the text, the last maybe only in part, and none wholly of the stop string
        assert joined.startswith(text)
        if tokens:
            assert len(joined) - len(tokens[-1]) < len(text)
        assert tokens == full.logprobs.tokens[:len(tokens)]


def test_logit_bias_forbids_and_forces(client, model, tokenizer):  # noqa: F811
    greedy = complete(client, model, logprobs=0)
    first = tokenizer.encode(greedy.choices[0].logprobs.tokens[0])
    assert len(first) == 1
    banned = complete(client, model, logprobs=0, logit_bias={str(first[0]): -100})
    assert banned.choices[0].logprobs.tokens[0] != greedy.choices[0].logprobs.tokens[0]
    forced_id = tokenizer.encode(" seven")[-1]
    forced = complete(client, model, max_tokens=3, logit_bias={str(forced_id): 100})
    assert forced.choices[0].text == tokenizer.decode([forced_id] * 3)


def test_penalties_are_accepted_and_break_a_repetition(client, model):  # noqa: F811
    plain = complete(client, model, max_tokens=LONG, logprobs=0)
    tokens = plain.choices[0].logprobs.tokens
    assert len(set(tokens)) < len(tokens), tokens          # a small model's greedy answer repeats itself
    for name in ("presence_penalty", "frequency_penalty"):
        r = complete(client, model, max_tokens=LONG, **{name: 2}).choices[0].text
        assert r != plain.choices[0].text, name
    assert chat(client, model, presence_penalty=-2, frequency_penalty=0.5).choices[0].finish_reason


@pytest.mark.parametrize("path, body, param", [
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"top_logprobs": 3}, "top_logprobs"),
    ("chat", {"logprobs": 3}, "logprobs"),
    ("chat", {"logit_bias": {"1": 100.5}}, "logit_bias"),
    ("chat", {"logit_bias": {"-1": 1}}, "logit_bias"),
    ("chat", {"logit_bias": {"abc": 1}}, "logit_bias"),
    ("chat", {"logit_bias": {"1": "x"}}, "logit_bias"),
    ("completions", {"logit_bias": {"1000000000": 1}}, "logit_bias"),
    ("completions", {"logprobs": 21}, "logprobs"),
    ("completions", {"logprobs": True}, "logprobs"),
    ("completions", {"logprobs": 2, "echo": True}, "echo"),
    ("completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("chat", {"frequency_penalty": -3}, "frequency_penalty")])
def test_out_of_range_is_a_400_naming_the_field(stack, model, path, body, param):  # noqa: F811
    base = ({"messages": [{"role": "user", "content": "a"}]} if path == "chat" else {"prompt": "a"})
    r = httpx.post(f"{stack.url}/v1/{'chat/' if path == 'chat' else ''}completions",
                   json={"model": model, "max_tokens": 2, **base, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
