"""The chat template as the API renders it (common/model/chat_template.py render_chat)."""
from __future__ import annotations

from typing import Callable

from common.model.chat_template import render_chat


def chat_renderer(template: str | None, preserve_thinking: bool) -> Callable[[list[dict], dict], str]:
    """The API's render(messages, variables): `enable_thinking` and `tools` among the variables are
    render_chat's arguments, the rest template variables; `preserve_thinking` is the router's default."""
    def render(messages: list[dict], variables: dict) -> str:
        extra = dict(variables)
        extra.setdefault("preserve_thinking", preserve_thinking)
        thinking = bool(extra.pop("enable_thinking", True))
        tools = extra.pop("tools", None)
        return render_chat(messages, template=template, enable_thinking=thinking, tools=tools,
                           template_kwargs=extra)
    return render
