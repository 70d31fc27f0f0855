"""`fermium demo`'s conversation: one chat turn with reasoning and a tool call, the tool run here,
and the answer to its result, all streamed from a running router.

The two tools are the ones the demo model was trained with (tools/demo_data.py): `lookup_line`
searches the held-out sample of the play that ships beside the model, `count_words` counts.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx

from fermium.stack import chat_events

QUESTION = 'Find the line that says "good sir! Pray, have you"'
TOOLS = [
    {"type": "function", "function": {
        "name": "lookup_line", "description": "Find the line of the play that holds these words",
        "parameters": {"type": "object", "properties": {"words": {"type": "string"}}, "required": ["words"]}}},
    {"type": "function", "function": {
        "name": "count_words", "description": "Count the words in a text",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}},
]
MAX_TOKENS = 160
_SPEAKER = re.compile(r"^[A-Z][A-Za-z .']*:$")
_WORD = re.compile(r"[a-z']+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def lookup_line(text: str, words: str) -> str:
    """The first line of `text` holding `words`, else the first that shares the most of them, as
    "line N, SPEAKER: line"; a miss when no line shares a word."""
    wanted = _words(words)
    best, best_shared, speaker = None, 0, "?"
    for number, line in enumerate(text.split("\n"), start=1):
        if _SPEAKER.match(line):
            speaker = line[:-1]
            continue
        found = f"line {number}, {speaker}: {line}"
        if words and words in line:
            return found
        shared = len(wanted & _words(line))
        if shared > best_shared:
            best, best_shared = found, shared
    return best or f"no line holds {words!r}"


def run_tool(name: str, arguments: dict, play: str) -> str:
    if name == "lookup_line":
        return lookup_line(play, str(arguments.get("words", "")))
    if name == "count_words":
        return str(len(str(arguments.get("text", "")).split()))
    return f"unknown tool {name!r}"


def stream_turn(url: str, messages: list[dict], out=sys.stdout) -> dict:
    """POST the conversation with the tools, print reasoning, content and tool calls as they stream;
    return the assistant message they add up to (OpenAI format)."""
    body = {"model": "fermium", "messages": messages, "tools": TOOLS, "stream": True,
            "max_tokens": MAX_TOKENS, "temperature": 0.0}
    reasoning, content, calls, channel = [], [], {}, None

    def show(kind: str, text: str) -> None:
        nonlocal channel
        if kind != channel:
            out.write(("\n" if channel else "") + f"[{kind}] ")
            channel = kind
        out.write(text)
        out.flush()

    try:
        for event in chat_events(url, body):
            if not event.get("choices"):
                continue
            delta = event["choices"][0].get("delta", {})
            if text := delta.get("reasoning_content"):
                reasoning.append(text)
                show("reasoning", text)
            if text := delta.get("content"):
                content.append(text)
                show("answer", text)
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call["index"], {"id": call.get("id"), "type": "function",
                                                         "function": {"name": "", "arguments": ""}})
                function = call.get("function") or {}
                if name := function.get("name"):
                    entry["function"]["name"] = name
                    show("tool call", name + " ")
                if fragment := function.get("arguments"):
                    entry["function"]["arguments"] += fragment
                    show("tool call", fragment)
    except httpx.TransportError as e:
        raise SystemExit(f"\nerror: lost the router at {url}: {e}") from None
    out.write("\n")
    out.flush()
    message = {"role": "assistant", "content": "".join(content) or None,
               "reasoning_content": "".join(reasoning) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def run(url: str, play_path: Path, question: str = QUESTION, out=sys.stdout) -> list[dict]:
    """The demo conversation: the question, the model's turn, and after a tool call the tool's
    result and the model's answer to it. Returns the messages."""
    play = play_path.read_text(encoding="utf-8")
    messages = [{"role": "user", "content": question}]
    out.write(f"> {question}\n")
    reply = stream_turn(url, messages, out)
    messages.append(reply)
    for call in reply.get("tool_calls", [])[:1]:
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except json.JSONDecodeError:
            arguments = {}
        result = run_tool(call["function"]["name"], arguments, play)
        out.write(f"[tool result] {result}\n")
        messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": result})
        messages.append(stream_turn(url, messages, out))
    return messages
