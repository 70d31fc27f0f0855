"""Chat formatting: the model's own Jinja chat template, rendered the way transformers renders it.

The template is data, not code we re-implement: a GGUF file usually embeds it
(`tokenizer.chat_template`), a checkpoint ships it (chat_template.jinja or tokenizer_config.json),
and templates/qwen3_6.jinja holds Qwen3.6's published one for files that carry none.
Rendering uses a sandboxed Jinja environment with transformers' conventions: trim_blocks,
lstrip_blocks, loop controls, a `tojson` that keeps non-ASCII text, and `raise_exception`.

Messages are checked before rendering, and OpenAI-style tool calls whose `arguments` is a JSON
string are parsed into the mapping the template iterates. Every problem is a ValueError.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from common.errors import UserError

BUNDLED_TEMPLATE = Path(__file__).with_name("templates") / "qwen3_6.jinja"
GGUF_TEMPLATE_KEY = "tokenizer.chat_template"
ROLES = ("system", "user", "assistant", "tool")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class ChatTemplateError(UserError, ValueError):
    """A conversation the template cannot render, with the reason in words."""


def default_template() -> str:
    return BUNDLED_TEMPLATE.read_text(encoding="utf-8")


def template_from_gguf(model) -> str:
    """The template embedded in a GGUF file (anything with .get/.has), else the bundled one."""
    if model.has(GGUF_TEMPLATE_KEY):
        embedded = model.get(GGUF_TEMPLATE_KEY)
        if isinstance(embedded, str) and embedded.strip():
            return embedded
    return default_template()


def template_from_checkpoint(directory: str | Path) -> str:
    """An HF checkpoint's template: chat_template.jinja, else tokenizer_config.json, else bundled."""
    directory = Path(directory)
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    config = directory / "tokenizer_config.json"
    if config.is_file():
        embedded = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(embedded, str) and embedded.strip():
            return embedded
    return default_template()


def render_chat(messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                enable_thinking: bool = True, tools: Sequence[Mapping[str, Any]] | None = None,
                template: str | None = None,
                template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The prompt text for `messages` (OpenAI chat format); `template` is Jinja source.

    `template_kwargs` are extra template variables, as OpenAI servers take them in
    `chat_template_kwargs` (e.g. {"preserve_thinking": True}). A template without that switch
    keeps earlier reasoning when it is set all the same: the reasoning goes into the content.
    """
    messages = _checked_messages(messages)
    source = template if template is not None else default_template()
    if (template_kwargs or {}).get("preserve_thinking") is True and "preserve_thinking" not in source:
        messages = [_fold_reasoning(m) for m in messages]
    if tools is not None and (isinstance(tools, (str, Mapping)) or not isinstance(tools, Sequence)
                              or not all(isinstance(t, Mapping) for t in tools)):
        raise ChatTemplateError("tools must be a list of tool definitions (dicts)")
    compiled = _compile(source)
    variables = dict(template_kwargs or {})
    variables.update(messages=messages, tools=list(tools) if tools else None,
                     add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking)
    try:
        return compiled.render(variables)          # a mapping: a variable named `self` is no keyword clash
    except ChatTemplateError:
        raise
    except (TemplateError, TypeError) as exc:          # TypeError: e.g. a template adding a null content
        raise ChatTemplateError(f"the chat template failed: {exc}") from exc


def _fold_reasoning(message: dict) -> dict:
    """An assistant turn's reasoning moved into its content as the model wrote it, for a template
    that has no `preserve_thinking` switch."""
    reasoning = message.get("reasoning_content")
    if message.get("role") != "assistant" or not isinstance(reasoning, str) or not isinstance(
            message.get("content") or "", str):
        return message
    folded = {k: v for k, v in message.items() if k != "reasoning_content"}
    folded["content"] = f"{THINK_OPEN}\n{reasoning.strip()}\n{THINK_CLOSE}\n\n{message.get('content') or ''}"
    return folded


# ---- the Jinja environment
def _raise_exception(message: str):
    raise ChatTemplateError(f"the chat template rejected the messages: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise ChatTemplateError(f"the chat template does not parse: {exc}") from exc


# ---- message checks
def _checked_messages(messages) -> list[dict]:
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise ChatTemplateError("messages must be a list of {'role': ..., 'content': ...} dicts, "
                                f"got {type(messages).__name__}")
    if not messages:
        raise ChatTemplateError("messages is empty; a chat needs at least one user message")
    return [_checked_message(i, m) for i, m in enumerate(messages)]


def _checked_message(index: int, message) -> dict:
    if not isinstance(message, Mapping):
        raise ChatTemplateError(f"message {index} must be a dict, got {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise ChatTemplateError(f"message {index} has role {role!r}; expected one of {', '.join(ROLES)}")
    message = copy.deepcopy(dict(message))
    content = message.get("content")
    has_calls = bool(message.get("tool_calls"))
    if content is None and not (role == "assistant" and has_calls):
        raise ChatTemplateError(f"message {index} ({role}) has no content")
    if content is not None and (isinstance(content, Mapping) or not isinstance(content, (str, Sequence))):
        raise ChatTemplateError(f"message {index} ({role}): content must be a string or a list of parts, "
                                f"got {type(content).__name__}")
    if has_calls:
        if role != "assistant":
            raise ChatTemplateError(f"message {index} ({role}) has tool_calls; only assistant messages may")
        message["tool_calls"] = [_checked_call(index, c) for c in message["tool_calls"]]
    return message


def _checked_call(index: int, call) -> dict:
    if not isinstance(call, Mapping):
        raise ChatTemplateError(f"message {index}: each tool call must be a dict")
    function = call.get("function", call)
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ChatTemplateError(f"message {index}: a tool call needs function.name")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ChatTemplateError(f"message {index}: arguments of tool call {function['name']!r} "
                                    f"are not valid JSON ({exc})") from None
    if not isinstance(arguments, Mapping):
        raise ChatTemplateError(f"message {index}: arguments of tool call {function['name']!r} "
                                f"must be a JSON object")
    function = {**function, "arguments": dict(arguments)}
    return {**call, "function": function} if "function" in call else function
