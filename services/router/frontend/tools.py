"""`tools`, `tool_choice` and `parallel_tool_calls` of a chat request, and the prompt they steer.

Tools are OpenAI function tools; each problem is a 400 naming its path (`tools[0].function.name`).
`tool_choice`:
- "none": the tools stay in the prompt (as vLLM renders them, so the prompt's prefix, and its
  snapshot, are the same as on the turns that allow calls) but the output is not parsed for calls.
- "auto" (the default when tools are given): the model decides; its calls are parsed.
- "required" and {"type": "function", "function": {"name": ...}}: the prompt is steered and the
  rest of the call is held to a grammar (structured.py, common/tool_grammar.py). A think block
  left open by the template is closed empty (the form the template uses with thinking off), and
  the answer is started for the model: `<tool_call>\\n<function=NAME>\\n` for a named choice or a
  single tool, `<tool_call>\\n<function=` for "required" with several; the grammar goes on from
  there, to the tools' names and parameter schemas.
`parallel_tool_calls: false` keeps only the first call of an answer, as vLLM does.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import bad_request

NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")     # OpenAI's rule for function names, plus '.'
CHOICES = ("none", "auto", "required")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, FUNCTION_OPEN = "<tool_call>\n", "<function="


@dataclass(frozen=True)
class ToolPlan:
    """The validated tools of a request and what its tool_choice asks of the answer."""

    tools: tuple[dict, ...] = ()
    choice: str = "none"            # none | auto | required | function
    name: str | None = None         # the function a named choice forces
    parallel: bool = True

    @property
    def parsed(self) -> tuple[dict, ...]:
        """The tools the output parser looks for: none when tool_choice is 'none'."""
        return () if self.choice == "none" else self.tools

    @property
    def forced(self) -> str:
        """The start of the answer written for the model ("" when the model starts it)."""
        name = self.name
        if self.choice == "required" and len(self.tools) == 1:
            name = self.tools[0]["function"]["name"]
        if self.choice not in ("required", "function"):
            return ""
        return CALL_OPEN + FUNCTION_OPEN + (f"{name}>\n" if name else "")


def tool_plan(body: dict) -> ToolPlan:
    tools = _tools(body.get("tools"))
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    choice, name = _choice(body.get("tool_choice"), tools)
    return ToolPlan(tools, choice, name, parallel is not False)


def steer(prompt: str, forced: str) -> tuple[str, bool]:
    """(the prompt to generate from, whether the answer opens in a think block)."""
    thinking = prompt.rstrip("\n").endswith(THINK_OPEN)
    if not forced:
        return prompt, thinking
    if thinking:                                 # a call cannot start inside reasoning
        prompt = prompt.rstrip("\n") + "\n\n" + THINK_CLOSE + "\n\n"
    return prompt + forced, False


def _tools(tools: Any) -> tuple[dict, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of function tools", "tools")
    seen: set[str] = set()
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_request(f"{where} must be an object", where)
        if tool.get("type") != "function":
            raise bad_request(f"{where}.type is {tool.get('type')!r}; only 'function' tools are supported",
                              f"{where}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"{where}.function must be an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise bad_request(f"{where}.function.name must be 1 to 64 letters, digits, '_', '-' or '.'",
                              f"{where}.function.name")
        if name in seen:
            raise bad_request(f"{where}.function.name {name!r} is declared twice", f"{where}.function.name")
        seen.add(name)
        for key, kind in (("description", str), ("strict", bool)):
            if function.get(key) is not None and not isinstance(function[key], kind):
                raise bad_request(f"{where}.function.{key} must be a {'string' if kind is str else 'boolean'}",
                                  f"{where}.function.{key}")
        _parameters(f"{where}.function.parameters", function.get("parameters"))
        out.append(tool)
    return tuple(out)


def _parameters(where: str, schema: Any) -> None:
    """An object schema whose property names can be written as `<parameter=KEY>`."""
    if schema is None:
        return
    if not isinstance(schema, dict):
        raise bad_request(f"{where} must be a JSON schema object", where)
    if schema.get("type", "object") != "object":
        raise bad_request(f"{where}.type is {schema['type']!r}; the parameters must be an object schema "
                          "(type 'object')", f"{where}.type")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise bad_request(f"{where}.properties must be an object", f"{where}.properties")
    for key, spec in properties.items():
        if not key or any(c in key for c in "<>\n"):
            raise bad_request(f"{where}.properties: {key!r} is not a parameter name the model can write",
                              f"{where}.properties")
        if not isinstance(spec, (dict, bool)):
            raise bad_request(f"{where}.properties.{key} must be a JSON schema", f"{where}.properties.{key}")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise bad_request(f"{where}.required must be a list of property names", f"{where}.required")


def _choice(choice: Any, tools: tuple[dict, ...]) -> tuple[str, str | None]:
    if choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise bad_request(f"tool_choice {choice!r} is not one of {', '.join(CHOICES)} or a named function",
                              "tool_choice")
        if choice == "required" and not tools:
            raise bad_request("tool_choice 'required' needs 'tools'", "tool_choice")
        return ("none" if not tools else choice), None
    function = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(function, dict):
        raise bad_request("tool_choice must be 'none', 'auto', 'required' or "
                          "{'type': 'function', 'function': {'name': ...}}", "tool_choice")
    name = function.get("name")
    if name not in {t["function"]["name"] for t in tools}:
        raise bad_request(f"tool_choice names {name!r}, which is not among the request's tools",
                          "tool_choice.function.name")
    return "function", name
