"""Anthropic Messages requests -> the OpenAI chat body that schema.validate turns into a Job, so
both APIs render the same prompt through the same checks.

- `system` (a string or text blocks) becomes the first, system, message.
- A user turn's `text` blocks become one user message, its `image` blocks (base64, or a URL with
  --allow-image-urls) image parts in their places (anthropic_images.py). Each `tool_result`
  becomes a `tool` message with its `tool_use_id`. A result with `is_error` is marked "Error: "
  for the model, since the template has no field for it.
- An assistant turn's `text` blocks become its content, its `thinking` blocks its
  `reasoning_content` (the template and --preserve-thinking decide whether earlier reasoning is
  rendered), and its `tool_use` blocks its `tool_calls`, with `input` as the arguments.
- Several text blocks are joined by a blank line, as separate paragraphs.
- A last assistant turn of text only is the start of the answer (Anthropic's prefill): the
  prompt ends with it, after an empty think block, and the reply holds only what follows it.
- `tools` ({name, description, input_schema}) become function tools.
- `tool_choice` maps auto -> auto, any -> required, tool -> the named function, none -> none.
  `disable_parallel_tool_use` becomes `parallel_tool_calls: false`.
- `thinking` {type: disabled} turns the template's thinking off; enabled and adaptive keep it on.
  When `thinking` is absent, the template's default holds, as llama-server does. `budget_tokens`
  is checked but not enforced.
- `stop_sequences` become `stop`; `temperature` (Anthropic's range, [0, 1]), `top_p`, `top_k` and
  `stream` pass as they are.
- `output_config.format` (json_schema) becomes a strict json_schema `response_format`.
- `metadata`, `cache_control` and the service options that do not change the answer are accepted
  and ignored. Any other field gets a 400, as Anthropic gives.
- Document and server-tool blocks are refused, and so are images outside user turns' own content.

Each problem is a 400 naming its path (`messages[1].content[0].tool_use_id`). `anthropic_param`
rewrites the paths of errors found later, in the OpenAI body, into the request's own, and puts
the path in the message when it is not there, since Anthropic's error body has no `param`.
"""
from __future__ import annotations

import re
from typing import Any

from .anthropic_images import ImageBlock, user_content
from .errors import APIError, bad_request

FIELDS = {"model", "max_tokens", "messages", "system", "tools", "tool_choice", "stop_sequences", "temperature",
          "top_p", "top_k", "stream", "thinking", "metadata"}
IGNORED = {"cache_control", "service_tier", "inference_geo", "speed", "diagnostics", "user_profile_id",
           "workspace_id", "output_config", "context_management"}
CHOICES = {"auto": "auto", "any": "required", "none": "none"}
THINKING = ("enabled", "disabled", "adaptive")
MIN_BUDGET = 1024               # Anthropic's least thinking budget
SEPARATOR = "\n\n"
_RENAMES = [(re.compile(r"tools\[(\d+)\]\.function\.parameters"), r"tools[\1].input_schema"),
            (re.compile(r"tools\[(\d+)\]\.function\."), r"tools[\1]."),
            (re.compile(r"tool_choice\.function\.name"), "tool_choice.name"),
            (re.compile(r"response_format\.json_schema"), "output_config.format"),
            (re.compile(r"'stop'"), "'stop_sequences'")]


def openai_body(body: dict, *, count: bool = False) -> tuple[dict, str]:
    """The chat completions body for an Anthropic Messages body, and the assistant's prefill (count:
    a count_tokens body, which needs no max_tokens and whose sampling fields are left out)."""
    unknown = sorted(set(body) - FIELDS - IGNORED)
    if unknown:
        raise bad_request(f"{unknown[0]}: Extra inputs are not permitted", unknown[0])
    if not isinstance(body.get("model"), str):
        raise bad_request("model: Field required (a string)", "model")
    if not count and body.get("max_tokens") is None:
        raise bad_request("max_tokens: Field required", "max_tokens")
    fmt = body.get("output_config", {}).get("format") if isinstance(body.get("output_config"), dict) else None
    names: dict[str, str] = {}
    turns = _messages(body.get("messages"), names)
    last = turns[-1]
    prefill = ""
    if last["role"] == "assistant" and set(last) == {"role", "content"} and last["content"]:
        prefill = turns.pop()["content"]
    out: dict[str, Any] = {"model": body["model"], "messages": _system(body.get("system")) + turns}
    if not count:
        out["max_tokens"] = body["max_tokens"]
        temperature = body.get("temperature")
        if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and not 0 <= temperature <= 1:
            raise bad_request(f"temperature: {temperature} is not in [0, 1]", "temperature")
        for name in ("temperature", "top_p", "top_k", "stream"):
            if body.get(name) is not None:
                out[name] = body[name]
        if body.get("stop_sequences") is not None:
            if not isinstance(body["stop_sequences"], list):
                raise bad_request("stop_sequences: must be a list of strings", "stop_sequences")
            if body["stop_sequences"]:
                out["stop"] = body["stop_sequences"]
    if body.get("tools") is not None:
        out["tools"] = _tools(body["tools"])
    out.update(_tool_choice(body.get("tool_choice")))
    out.update(_thinking(body.get("thinking")))
    if fmt is not None:
        out["response_format"] = _format(fmt)
    return out, prefill


def _format(fmt: Any) -> dict:
    """output_config.format {type: json_schema, schema} -> a strict json_schema response_format."""
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or "schema" not in fmt:
        raise bad_request("output_config.format must be {'type': 'json_schema', 'schema': {...}}",
                          "output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


def anthropic_param(e: APIError) -> APIError:
    """An error of the OpenAI body with its paths named as the Anthropic request has them."""
    message, param = e.message, e.param
    for pattern, repl in _RENAMES:
        message = pattern.sub(repl, message)
        param = pattern.sub(repl, param) if param else param
    if param == "stop":
        param = "stop_sequences"
    if param and param not in message:         # Anthropic's body has no `param`: the message names it
        message = f"{param}: {message}"
    return APIError(e.status, message, type=e.type, param=param, code=e.code, headers=e.headers)


def _text(where: str, blocks: list[dict]) -> str:
    for j, b in enumerate(blocks):
        if b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise bad_request(f"{where}[{j}]: only text blocks are supported here", f"{where}[{j}]")
    return SEPARATOR.join(b["text"] for b in blocks)


def _blocks(where: str, content: Any) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}: must be a string or a list of content blocks", where)
    for j, b in enumerate(content):
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise bad_request(f"{where}[{j}]: a content block needs a 'type'", f"{where}[{j}].type")
    return content


def _system(system: Any) -> list[dict]:
    if system is None:
        return []
    text = _text("system", _blocks("system", system))
    return [{"role": "system", "content": text}] if text else []


def _messages(messages: Any, names: dict[str, str]) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages: must be a non-empty list", "messages")
    out: list[dict] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad_request(f"{where}.role: must be 'user' or 'assistant'", f"{where}.role")
        blocks = _blocks(f"{where}.content", m.get("content"))
        if not blocks:
            raise bad_request(f"{where}.content: must not be empty", f"{where}.content")
        out += _assistant(f"{where}.content", blocks, names) if m["role"] == "assistant" else \
            _user(f"{where}.content", blocks, names)
    return out


def _user(where: str, blocks: list[dict], names: dict[str, str]) -> list[dict]:
    """Text and image blocks -> user messages; each tool_result -> a tool message, in the blocks' order."""
    out: list[dict] = []
    text: list = []                  # str, or ImageBlock

    def flush() -> None:
        if text:
            out.append({"role": "user", "content": user_content(text, SEPARATOR)})
            text.clear()

    for j, b in enumerate(blocks):
        at = f"{where}[{j}]"
        if b["type"] == "text":
            if not isinstance(b.get("text"), str):
                raise bad_request(f"{at}.text: must be a string", f"{at}.text")
            text.append(b["text"])
        elif b["type"] == "image":
            text.append(ImageBlock(b, at))
        elif b["type"] == "tool_result":
            flush()
            out.append(_tool_result(at, b, names))
        else:
            raise bad_request(f"{at}.type: {b['type']!r} blocks are not supported in user turns; this server "
                              "reads text, image and tool_result blocks", f"{at}.type")
    flush()
    return out


def _tool_result(at: str, b: dict, names: dict[str, str]) -> dict:
    call_id = b.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"{at}.tool_use_id: Field required (a string)", f"{at}.tool_use_id")
    content = b.get("content", "")
    text = "" if content is None else _text(f"{at}.content", _blocks(f"{at}.content", content))
    error = b.get("is_error")
    if error is not None and not isinstance(error, bool):
        raise bad_request(f"{at}.is_error: must be a boolean", f"{at}.is_error")
    message = {"role": "tool", "tool_call_id": call_id, "content": f"Error: {text}" if error else text}
    if call_id in names:
        message["name"] = names[call_id]
    return message


def _assistant(where: str, blocks: list[dict], names: dict[str, str]) -> list[dict]:
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict] = []
    for j, b in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = b["type"]
        if kind == "text" or kind == "thinking":
            value = b.get(kind)
            if not isinstance(value, str):
                raise bad_request(f"{at}.{kind}: must be a string", f"{at}.{kind}")
            (text if kind == "text" else thinking).append(value)
        elif kind == "tool_use":
            calls.append(_tool_use(at, b, names))
        elif kind != "redacted_thinking":          # encrypted for Anthropic's models; nothing to render
            raise bad_request(f"{at}.type: {kind!r} blocks are not supported in assistant turns", f"{at}.type")
    message: dict[str, Any] = {"role": "assistant", "content": SEPARATOR.join(text) if text or not calls else None}
    if thinking:
        message["reasoning_content"] = SEPARATOR.join(thinking)
    if calls:
        message["tool_calls"] = calls
    return [message]


def _tool_use(at: str, b: dict, names: dict[str, str]) -> dict:
    for key in ("id", "name"):
        if not isinstance(b.get(key), str) or not b[key]:
            raise bad_request(f"{at}.{key}: Field required (a non-empty string)", f"{at}.{key}")
    arguments = b.get("input", {})
    if not isinstance(arguments, dict):
        raise bad_request(f"{at}.input: must be an object", f"{at}.input")
    names[b["id"]] = b["name"]
    return {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": arguments}}


def _tools(tools: Any) -> list[dict]:
    if not isinstance(tools, list):
        raise bad_request("tools: must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_request(f"{where}: must be an object", where)
        kind = tool.get("type", "custom")
        if kind != "custom":
            raise bad_request(f"{where}.type: {kind!r} is a server tool, which this server does not run; send "
                              "custom tools (name, description, input_schema)", f"{where}.type")
        if "input_schema" not in tool:
            raise bad_request(f"{where}.input_schema: Field required", f"{where}.input_schema")
        function = {"name": tool.get("name")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": {**function, "parameters": tool["input_schema"]}})
    return out


def _tool_choice(choice: Any) -> dict:
    if choice is None:
        return {}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in (*CHOICES, "tool"):
        raise bad_request("tool_choice.type: must be 'auto', 'any', 'tool' or 'none'", "tool_choice.type")
    out: dict[str, Any] = {"tool_choice": CHOICES.get(kind)}
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise bad_request("tool_choice.name: Field required for type 'tool'", "tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    single = choice.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise bad_request("tool_choice.disable_parallel_tool_use: must be a boolean",
                          "tool_choice.disable_parallel_tool_use")
    if single:
        out["parallel_tool_calls"] = False
    return out


def _thinking(thinking: Any) -> dict:
    if thinking is None:
        return {}
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in THINKING:
        raise bad_request(f"thinking.type: must be one of {', '.join(THINKING)}", "thinking.type")
    budget = thinking.get("budget_tokens")
    if kind == "enabled" and (not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_BUDGET):
        raise bad_request(f"thinking.budget_tokens: must be an integer >= {MIN_BUDGET}", "thinking.budget_tokens")
    return {"chat_template_kwargs": {"enable_thinking": kind != "disabled"}}
