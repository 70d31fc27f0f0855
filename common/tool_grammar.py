"""A grammar that forces one Qwen3.6 XML tool call, for tool_choice `required` or a named function.

Qwen3.6 writes a call as `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...
</function>\n</tool_call>`; the grammar (llguidance's lark) holds it to the tools' names and
parameter schemas. The spec travels in SamplingParams.grammar like a response_format's
(common.grammar).
"""
from __future__ import annotations

import json
from typing import Any

import llguidance as llg

from .grammar import GrammarError, Vocab, check_schema, validate

CALL_OPEN, FUNCTION_OPEN = "<tool_call>\n", "<function="


def tool_call_grammar(tools: list[dict], tokenizer: Vocab, name: str | None = None, started: str = "") -> str:
    """A grammar for one Qwen3.6 XML tool call to `name`, or to any of `tools` when None:

        <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>

    `started` is the part of the call the prompt already holds, for the grammar to go on from:
    "", `<tool_call>\\n<function=` or `<tool_call>\\n<function=NAME>\\n`.

    A string parameter's value is free text (up to `\\n</parameter>`), a string enum's one of its
    words, bare, as Qwen3.6 writes strings; any other is JSON of its schema. Parameters come in
    the schema's order; the optional ones may be left out."""
    functions = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise GrammarError(f"tools[{i}].function.name: a tool needs a function with a name")
        functions[fn["name"]] = (i, fn.get("parameters") or {"type": "object", "properties": {}})
    if name is not None and name not in functions:
        raise GrammarError(f"tool_choice.function.name: {name!r:.80} is not one of the tools")
    chosen = [name] if name is not None else list(functions)
    if not chosen:
        raise GrammarError("tools: a forced tool call needs at least one tool")
    close = f'"\\n" {_token(tokenizer, "</tool_call>")}'
    heads = {CALL_OPEN + FUNCTION_OPEN + f + ">\n": k for k, f in enumerate(chosen)}
    if started in ("", CALL_OPEN + FUNCTION_OPEN):
        rest = "" if started else FUNCTION_OPEN             # what each alternative still writes first
        call = " | ".join(f"{_lit(rest + f + '>' + chr(10))} body{k}" for k, f in enumerate(chosen))
        start = "" if started else f"{_token(tokenizer, '<tool_call>')} \"\\n\" "
        rules = [f"start: {start}call {close}", f"call: {call}"]
    elif started in heads:
        rules = [f"start: body{heads[started]} {close}"]
    else:
        raise GrammarError(f"tool_choice: a call cannot go on from {started!r:.80}")
    for k, fname in enumerate(chosen):
        i, params = functions[fname]
        rules += _function_rules(k, params, f"tools[{i}].function.parameters")
    return validate(llg.LLMatcher.grammar_from_lark("\n".join(rules)), tokenizer, "tools")


def _function_rules(k: int, params: Any, where: str) -> list[str]:
    check_schema(params, where)
    props = params.get("properties", {}) if isinstance(params, dict) else {}
    required = set(params.get("required", [])) if isinstance(params, dict) else set()
    body, rules = [], []
    end = _lit("\n</parameter>\n")
    for j, (key, prop) in enumerate(props.items()):
        words = _raw_words(prop)
        if words is not None:                  # Qwen3.6 writes a string enum bare, as it writes strings
            value = f"v{k}_{j}: ({' | '.join(_lit(w) for w in words)}) {end}"
        elif _is_string(prop):
            value = f'v{k}_{j}[stop={end}]: /(.|\\n)*/'
        else:
            value = f"v{k}_{j}: %json {json.dumps(prop)} {end}"
        rules += [f"p{k}_{j}: {_lit(f'<parameter={key}>' + chr(10))} v{k}_{j}", value]
        body.append(f"p{k}_{j}" if key in required else f"p{k}_{j}?")
    return [f"body{k}: {' '.join(body)} {_lit('</function>')}", *rules]


def _raw_words(prop: Any) -> list[str] | None:
    """The strings of a string-only enum or const, else None."""
    if not isinstance(prop, dict):
        return None
    words = prop.get("enum", [prop["const"]] if "const" in prop else None)
    if isinstance(words, list) and words and all(isinstance(w, str) for w in words):
        return words
    return None


def _is_string(prop: Any) -> bool:
    return isinstance(prop, dict) and prop.get("type") == "string"


def _lit(text: str) -> str:
    return json.dumps(text)                   # a lark string literal is a JSON string


def _token(tokenizer: Vocab, text: str) -> str:
    """The special token spelled `text` when the vocabulary has one (Qwen3.6 does), else the text."""
    tid = tokenizer.token_to_id(text)
    return f"<[{tid}]>" if tid is not None and tokenizer.is_special(tid) else _lit(text)
