"""The `messages` of a chat request, checked and reduced to what the chat template reads.

What clients send back in an agent loop is accepted: assistant turns with `tool_calls` (and
`content: null`) and earlier `reasoning_content` (or vLLM's `reasoning`), `tool` turns with
`tool_call_id` and `name`, and the `developer` role, which is the system turn of newer OpenAI
clients. Content may be a string or a list of text parts; the parts are joined. With a vision
tower (`read_image`, services/router/frontend/vision.py), a user turn's list may hold `image_url` parts too:
each is read then and stands in the text as what `read_image` returns (the template's image
markers, vision.py IMAGE_TEXT). Other keys of a message (`refusal`, `audio`, ...) are dropped.
Each problem is a 400 naming its path.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from .errors import bad_request
from .images import is_image_part

ReadImage = Callable[[dict, str], str]     # (part, its path) -> the text it stands as
NO_VISION = "image parts need a vision tower; this server was started without --mmproj"
USER_ONLY = "image parts are read in user messages only"

ROLES = {"system", "developer", "user", "assistant", "tool"}
TEMPLATE_ROLE = {"developer": "system"}     # the template knows four roles


def chat_messages(body: dict, read_image: ReadImage | None = None) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    return [_message(i, m, read_image) for i, m in enumerate(messages)]


def _message(i: int, m: Any, read_image: ReadImage | None = None) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
        raise bad_request(f"{where} needs a 'role', one of {sorted(ROLES)}", f"{where}.role")
    role, calls = m["role"], m.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise bad_request(f"{where}: only assistant messages carry 'tool_calls'", f"{where}.tool_calls")
        if not isinstance(calls, list):
            raise bad_request(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
        calls = [_call(f"{where}.tool_calls[{j}]", c) for j, c in enumerate(calls)]
    out: dict[str, Any] = {"role": TEMPLATE_ROLE.get(role, role),
                           "content": _content(where, m.get("content"), bool(calls),
                                               read_image if role == "user" else None,
                                               NO_VISION if read_image is None else USER_ONLY)}
    if calls:
        out["tool_calls"] = calls
    reasoning = m.get("reasoning_content", m.get("reasoning"))
    if reasoning is not None and role == "assistant":
        if not isinstance(reasoning, str):
            raise bad_request(f"{where}.reasoning_content must be a string", f"{where}.reasoning_content")
        out["reasoning_content"] = reasoning
    for key in ("tool_call_id", "name"):
        value = m.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise bad_request(f"{where}.{key} must be a string", f"{where}.{key}")
        out[key] = value
    return out


def _content(where: str, content: Any, has_calls: bool, read_image: ReadImage | None = None,
             no_image: str = "") -> str | None:
    if content is None and has_calls:
        return None
    if isinstance(content, list):
        text = []
        for j, p in enumerate(content):
            at = f"{where}.content[{j}]"
            if is_image_part(p):
                if read_image is None:
                    raise bad_request(f"{at}: {no_image}", at)
                text.append(read_image(p, at))
            elif isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                text.append(p["text"])
            else:
                raise bad_request(f"{at}: only text and image_url parts are supported", at)
        return "".join(text)
    if not isinstance(content, str):
        raise bad_request(f"{where}.content must be a string or a list of text parts", f"{where}.content")
    return content


def _call(where: str, call: Any) -> dict:
    """An OpenAI tool call of an earlier turn; `arguments` may be a JSON string or an object."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise bad_request(f"{where} must be an object with a 'function'", f"{where}.function")
    if call.get("type", "function") != "function":
        raise bad_request(f"{where}.type must be 'function'", f"{where}.type")
    function = call["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"{where}.function.name must be a non-empty string", f"{where}.function.name")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as e:
            raise bad_request(f"{where}.function.arguments is not valid JSON: {e}",
                              f"{where}.function.arguments") from None
    if not isinstance(arguments, dict):
        raise bad_request(f"{where}.function.arguments must be a JSON object", f"{where}.function.arguments")
    out = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out
