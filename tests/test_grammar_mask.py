"""common.grammar: response_format checks that name the schema path, matchers driven by scripted
output (what they accept, what their mask forbids), the forced tool-call grammar, and the
sampler keeping to a mask. On the demo model's vocabulary."""
from __future__ import annotations

import json

import numpy as np
import pytest

from common import grammar
from common.grammar import GrammarError, Matcher, compile_response_format
from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from common.sampling import Sampler, SamplingParams
from common.tool_grammar import tool_call_grammar

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "role": {"enum": ["admin", "user"]},
                         "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "role", "tags"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_gguf(GGUFModel(default_model_path()))


def schema_format(schema, strict=True):
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": strict}}


def follow(spec, tok, text) -> Matcher:
    """A matcher fed `text`'s tokens, each checked against the mask first."""
    m = Matcher(spec, grammar.engine_tokenizer(tok))
    for t in tok.encode(text):
        assert not m.done
        assert grammar.allowed(grammar.fill_masks([m], tok.vocab_size)[0], tok.vocab_size)[t], tok.decode([t])
        m.consume(t)
    return m


def allowed_now(m, tok) -> np.ndarray:
    return grammar.allowed(grammar.fill_masks([m], tok.vocab_size)[0], tok.vocab_size)


# ---- response_format checks ------------------------------------------------------------------
@pytest.mark.parametrize("fmt, message", [
    (schema_format({"type": "object", "properties": {"age": {"type": "integr"}}}),
     "response_format.json_schema.schema.properties.age.type: 'integr' is not a JSON-schema type"),
    (schema_format({"type": "object", "properties": {"tags": {"type": "array", "minItems": "x"}}}),
     "response_format.json_schema.schema.properties.tags.minItems: 'x' is not of type 'integer'"),
    (schema_format({"anyOf": [{"type": "string"}, {"type": 3}]}),
     "response_format.json_schema.schema.anyOf[1].type: 3 is not a JSON-schema type"),
    (schema_format([1]), "response_format.json_schema.schema: a JSON schema is an object or a boolean"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name: must be"),
    ({"type": "json_schema"}, "response_format.json_schema: must be an object"),
    ({"type": "yaml"}, "response_format.type: 'yaml' is not one of"),
    ("json", "response_format: must be an object"),
    (schema_format({"type": "object", "properties": {"n": {"not": {"type": "string"}}}}),
     "response_format.json_schema.schema.properties.n.not: 'not' cannot be enforced"),
    (schema_format({"type": "object", "properties": {"d": {"type": "string", "format": "weird"}}}),
     "response_format.json_schema.schema.properties.d.format: 'weird' is not a known format"),
    (schema_format({"properties": {"a": {"$ref": "#/$defs/nope"}}}),
     "response_format.json_schema.schema: Pointer '/$defs/nope' does not exist"),
])
def test_an_invalid_format_names_the_path(fmt, message):
    with pytest.raises(GrammarError) as e:
        compile_response_format(fmt)
    assert str(e.value).startswith(message), str(e.value)
    assert isinstance(e.value, ValueError)             # the router's 400


def test_a_schema_too_big_to_travel_is_refused():
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(3000)}}
    with pytest.raises(GrammarError, match=r"^response_format.json_schema.schema: the grammar is \d+ characters"):
        compile_response_format(schema_format(big))


def test_text_is_no_grammar_and_the_formats_compile(tok):
    assert compile_response_format(None) == compile_response_format({"type": "text"}) == ""
    for fmt in ({"type": "json_object"}, schema_format(SCHEMA), schema_format(SCHEMA, strict=False)):
        assert json.loads(compile_response_format(fmt, tok))["grammars"]


# ---- matchers on scripted output -------------------------------------------------------------
def test_a_valid_document_is_accepted_and_then_the_grammar_is_done(tok):
    spec = compile_response_format(schema_format(SCHEMA), tok)
    doc = json.dumps({"name": "Ann \"Q\" Lee", "age": 41, "role": "admin", "tags": ["a", "b c"]})
    assert follow(spec, tok, doc).done


def test_the_mask_forbids_what_breaks_the_schema(tok):
    spec = compile_response_format(schema_format(SCHEMA), tok)
    ok = allowed_now(Matcher(spec, grammar.engine_tokenizer(tok)), tok)
    assert ok[tok.encode('{"')[0]] and not ok[tok.encode("[")[0]] and not ok[tok.encode(" ")[0]]
    m = follow(spec, tok, '{"name": "x", "age": ')
    ok = allowed_now(m, tok)
    assert not ok[tok.encode('"')[0]] and not ok[tok.encode("t")[0]]
    assert all(ok[tok.encode(d)[0]] for d in "123456789")
    m = follow(spec, tok, '{"name": "x", "age": 3, "role": "')
    ok = allowed_now(m, tok)
    assert not ok[tok.encode("x")[0]] and ok[tok.encode("a")[0]]
    with pytest.raises(GrammarError, match="does not continue"):
        m.consume(tok.encode("x")[0])


def test_json_object_takes_any_object_and_no_other_value(tok):
    spec = compile_response_format({"type": "json_object"}, tok)
    assert follow(spec, tok, json.dumps({"a": [1, {"b": None}], "c": "d"})).done
    ok = allowed_now(Matcher(spec, grammar.engine_tokenizer(tok)), tok)
    assert not ok[tok.encode("[")[0]] and not ok[tok.encode("1")[0]]


def test_eos_is_allowed_only_where_the_grammar_may_end(tok):
    spec = compile_response_format({"type": "json_object"}, tok)
    m = follow(spec, tok, '{"a": 1')
    assert not any(allowed_now(m, tok)[i] for i in tok.eos_ids)


# ---- the forced tool call --------------------------------------------------------------------
def call(name, **params) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_a_named_tool_call_is_accepted_with_free_text_and_typed_values(tok):
    spec = tool_call_grammar([WEATHER, TIME], tok, name="get_weather")
    assert follow(spec, tok, call("get_weather", city="Paris </par\nis", days=3, unit="c")).done
    assert follow(spec, tok, call("get_weather", city="Rome", days=10)).done        # unit is optional
    m = follow(spec, tok, "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n"
                          "<parameter=days>\n")
    ok = allowed_now(m, tok)
    assert not ok[tok.encode("t")[0]] and ok[tok.encode("7")[0]]
    head = call("get_weather", city="X", days=1)[:-len("</function>\n</tool_call>")]
    m = follow(spec, tok, head + "<parameter=unit>\n")
    ok = allowed_now(m, tok)
    assert not ok[tok.encode('"')[0]] and not ok[tok.encode("x")[0]]          # an enum's word, bare
    ok = allowed_now(follow(spec, tok, "<tool_call>\n<function=get_"), tok)
    assert ok.any() and all(tok.decode([int(i)]).startswith("w") for i in np.flatnonzero(ok))   # not get_time


def test_a_call_the_prompt_started_goes_on_from_there(tok):
    whole = call("get_weather", city="Oslo", days=2)
    for started in ("<tool_call>\n<function=", "<tool_call>\n<function=get_weather>\n"):
        spec = tool_call_grammar([WEATHER, TIME], tok, name=None if started.endswith("=") else "get_weather",
                                 started=started)
        assert follow(spec, tok, whole[len(started):]).done
    with pytest.raises(GrammarError, match="tool_choice: a call cannot go on from"):
        tool_call_grammar([WEATHER], tok, started="<tool_call>\n<function=get_time>\n")


def test_any_tool_may_be_called_without_a_name_and_bad_tools_are_named(tok):
    spec = tool_call_grammar([WEATHER, TIME], tok)
    assert follow(spec, tok, call("get_time", zone="UTC")).done
    with pytest.raises(GrammarError, match=r"tool_choice.function.name: 'nope'"):
        tool_call_grammar([WEATHER], tok, name="nope")
    with pytest.raises(GrammarError, match=r"tools\[1\].function.name"):
        tool_call_grammar([WEATHER, {"type": "function"}], tok)
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integr"}}}}}
    with pytest.raises(GrammarError, match=r"tools\[0\].function.parameters.properties.n.type: 'integr'"):
        tool_call_grammar([bad], tok)


# ---- the sampler keeps to the mask -----------------------------------------------------------
def test_the_sampler_draws_only_allowed_tokens():
    rng = np.random.default_rng(0)
    allowed = np.zeros(500, bool)
    allowed[[3, 77, 499]] = True
    for params in (SamplingParams(), SamplingParams(temperature=1.0, top_k=5, seed=1),
                   SamplingParams(temperature=0.7, top_p=0.9, min_p=0.1, repetition_penalty=1.3, seed=2)):
        sampler = Sampler(params)
        for _ in range(50):
            assert allowed[sampler.sample(rng.normal(size=500) * 5, [3, 4], allowed)]
    dead = np.full(500, -np.inf)
    dead[0] = 1.0
    assert Sampler(SamplingParams(temperature=1.0)).sample(dead, (), allowed) == 3
    logits = np.zeros(500)
    logits[[3, 77]] = 2.0, 1.5
    greedy = Sampler(SamplingParams(repetition_penalty=2.0))
    assert greedy.sample(logits, [], allowed) == 3 and greedy.sample(logits, [3, 9, 3], allowed) == 77


def test_a_grammar_spec_is_a_bounded_string():
    assert SamplingParams(grammar="start: \"a\"").grammar
    with pytest.raises(ValueError, match="grammar"):
        SamplingParams(grammar="x" * (1 << 19))
    with pytest.raises(ValueError, match="grammar"):
        SamplingParams(grammar=3)
