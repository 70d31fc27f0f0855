r"""Tool calls in Qwen3.6's XML format, parsed from the content channel as it streams.

`<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`,
one block per call (with no tools, `<tool_call>` is plain text). A call streams as a header (index, id,
name, arguments "") once `<function=NAME>` is complete, then one arguments fragment per completed parameter
and a closing `}`; the fragments join to the final JSON object. VALUE is typed by the tool's schema.

Malformed output never raises: what cannot be a call stays content, and `failures` counts every
malformed spot (for a metric). The rules, where vLLM (qwen3_coder) and llama-server differ:
- Text before the first `<tool_call>` is content, less the newlines right before the tag.
- An unknown `<function=NAME>`, or a `<tool_call>` without `<function=`, is content verbatim up to its
  `</tool_call>`. llama-server's grammar only has the declared names, vLLM takes any: a client cannot run
  an undeclared one.
- A value missing `</parameter>` ends at the next "\n<parameter=", "\n</function>" or "\n</tool_call>"
  (vLLM ends it at `<parameter=` or `</function>`; llama-server's grammar at the same with the newline).
- A stray `</parameter>` or `</function>` is dropped, a repeated key keeps its first value, and a
  missing `</function>` or `</tool_call>` is implied by what follows.
- A call open at the end of generation (max_tokens) stays a call, closed as it stands (as vLLM does):
  its header and arguments were already streamed.
- Text after a call (the template asks for none) is content; vLLM drops it, llama-server keeps it.
- A `<think>` block outside a call goes to reasoning, as in llama-server (a model thinking with thinking
  off, or opening a think block after its answer); only a leading one is not a failure. A stray `</think>`
  is dropped: reasoning that ran into a call and closed after it leaves one.
"""
from __future__ import annotations

import random
import secrets
from collections.abc import Iterable
from enum import Enum
from typing import Any

from .arguments import Arguments, ToolSchemas
from .message import Delta, ToolCallDelta, merge
from .reasoning import THINK, THINK_END, ReasoningParser
from .scan import find_first, is_partial, partial_suffix

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAM, PARAM_END = "<parameter=", "</parameter>"
NAME_LIMIT = 256  # characters; a function or parameter name longer than this is not one
_VALUE_ENDS = (PARAM_END, "\n" + PARAM, "\n" + FUNCTION_END, "\n" + CLOSE)
_VALUE_TAIL = max(len(tag) for tag in _VALUE_ENDS) - 1
_CALL_TAGS = (PARAM, FUNCTION_END, CLOSE, PARAM_END, OPEN)
_SPACE = " \t\r\n"


class _State(Enum):
    TEXT = 1  # content, between calls too
    THINK = 2  # inside a `<think>` block met in the content
    OPEN = 3  # after `<tool_call>`, until `<function=NAME>` is known
    CALL = 4  # in a call, between parameters
    VALUE = 5  # in a parameter value
    RAW = 6  # a block that is not a call, passed on as content up to `</tool_call>`


class ToolCallParser:
    """Streaming parser of the content channel: feed(delta) -> list[Delta]; finish() -> list[Delta].

    `tools` is the request's OpenAI `tools` list; `seed` makes the call ids reproducible;
    `after_think`: the channel follows a think block, so a `<think>` even at its start is out of place.
    `failures` and `calls` may be read at any time.
    """

    def __init__(self, tools: Iterable[Any] | None = None, seed: int | None = None, after_think: bool = False):
        self._schemas = ToolSchemas(tools)
        self._text_tags = (OPEN, THINK, THINK_END) if self._schemas else (THINK, THINK_END)
        self._rng = random.Random(seed) if seed is not None else None
        self.failures = 0
        self.calls = 0  # calls opened so far; the next call's index
        self._state = _State.TEXT
        self._buf = ""
        self._out: list[Delta] = []
        self._held_newlines = 0  # content newlines dropped if a tag follows
        self._skip = ""  # characters dropped from the start of the next text
        self._junk = False  # inside a run of text that has no place here (counted once)
        self._started = after_think  # anything emitted yet: a `<think>` after that is out of place
        self._content_seen = False
        self._gap = False  # content resuming after a call or think block is set apart by a blank line
        self._think: ReasoningParser | None = None
        self._args = Arguments(self._schemas, "")
        self._key = ""
        self._function_closed = False  # `</function>` seen; `</tool_call>` due
        self._scan = 0  # where the search for the value's end resumes

    def feed(self, text: str) -> list[Delta]:
        self._buf += text
        while self._step(final=False):
            pass
        out, self._out = merge(self._out), []
        return out

    def finish(self) -> list[Delta]:
        while self._step(final=True):
            pass
        if self._state in (_State.CALL, _State.VALUE):
            self.failures += 1  # generation ended inside a call
            self._close_call()
        if self._held_newlines:
            self._out.append(Delta(content="\n" * self._held_newlines))
            self._held_newlines = 0
        out, self._out = merge(self._out), []
        return out

    def _step(self, final: bool) -> bool:
        """Consume what the buffer allows in the current state; True when another step may follow."""
        return getattr(self, f"_{self._state.name.lower()}_step")(final)

    # ---- content ----
    def _text_step(self, final: bool) -> bool:
        buf = self._buf
        i, tag = find_first(buf, self._text_tags)
        if tag is None:
            cut = len(buf) if final else len(buf) - partial_suffix(buf, self._text_tags)
            self._text(buf[:cut])
            self._buf = buf[cut:]
            return False
        self._text(buf[:i])
        self._buf = buf[i + len(tag):]
        if tag == OPEN:
            self._state = _State.OPEN  # the newlines before it go if it proves a call
            return True
        self._tag_seen(gap=True)
        if tag == THINK:
            self.failures += self._started
            self._think = ReasoningParser(enabled=True)
            self._state = _State.THINK
        else:
            self.failures += 1
            self._skip = _SPACE if self.calls else "\n"
        return True

    def _text(self, text: str) -> None:
        if self._skip:
            text = text.lstrip(self._skip)
            if not text:
                return
            self._skip = ""
        if text and self.calls and not self._junk:
            self.failures += 1  # text after a call; a run of it counts once
            self._junk = True
        self._content(text)

    def _content(self, text: str) -> None:
        joined = "\n" * self._held_newlines + text
        kept = joined.rstrip("\n")
        self._held_newlines = len(joined) - len(kept)
        if kept:
            gap = "\n\n" if self._gap and self._content_seen else ""
            self._out.append(Delta(content=gap + kept))
            self._started = self._content_seen = True
            self._gap = False

    def _tag_seen(self, gap: bool = False) -> None:
        self._held_newlines = 0
        self._junk = False
        self._gap = self._gap or gap

    def _think_step(self, final: bool) -> bool:
        reasoning, rest = self._think.feed(self._buf)
        if final and not self._think.ended:
            more_reasoning, more_rest = self._think.finish()
            reasoning, rest = reasoning + more_reasoning, rest + more_rest
        if reasoning:
            self._out.append(Delta(reasoning_content=reasoning))
            self._started = True
        self._buf = ""
        if not (self._think.ended or final):
            return False
        self._think = None
        self._state = _State.TEXT
        self._skip = _SPACE if self.calls else "\n"
        self._buf = rest
        return True

    def _raw_step(self, final: bool) -> bool:
        buf = self._buf
        i = buf.find(CLOSE)
        if i < 0:
            cut = len(buf) if final else len(buf) - partial_suffix(buf, (CLOSE,))
            self._content(buf[:cut])
            self._buf = buf[cut:]
            return False
        self._content(buf[:i + len(CLOSE)])
        self._buf = buf[i + len(CLOSE):]
        self._state = _State.TEXT
        self._skip = _SPACE if self.calls else ""
        return True

    # ---- calls ----
    def _open_step(self, final: bool) -> bool:
        rest = self._buf.lstrip()
        if not final and (not rest or is_partial(rest, (FUNCTION,))):
            return False
        if rest.startswith(FUNCTION):
            end = rest.find(">", len(FUNCTION))
            name = rest[len(FUNCTION):] if end < 0 else rest[len(FUNCTION):end]
            plausible = "\n" not in name and len(name) < NAME_LIMIT  # decided alike however the text was cut
            if end < 0 and not final and plausible:
                return False
            if end >= 0 and plausible and name.strip() in self._schemas:
                self._buf = rest[end + 1:]
                self._open_call(name.strip())
                return True
        self.failures += 1  # not a call: unknown name, or no `<function=`
        self._content(OPEN)
        self._state = _State.RAW
        return True

    def _open_call(self, name: str) -> None:
        self._tag_seen(gap=True)
        self._args = Arguments(self._schemas, name)
        self._function_closed = False
        self._state = _State.CALL
        self._started = True
        call_id = "call_" + (f"{self._rng.getrandbits(96):024x}" if self._rng else secrets.token_hex(12))
        self._out.append(Delta(tool_call=ToolCallDelta(index=self.calls, id=call_id, name=name)))

    def _close_call(self) -> None:
        self._out.append(Delta(tool_call=ToolCallDelta(index=self.calls, arguments=self._args.close())))
        self.calls += 1
        self._state = _State.TEXT
        self._skip = _SPACE
        self._junk = False

    def _junk_step(self) -> bool:
        """Text inside a call that is no part of it: passed on as content, up to the next `<`."""
        buf = self._buf
        k = buf.find("<", 1)
        piece = buf if k < 0 else buf[:k]
        self.failures += not self._junk
        self._junk = True
        self._content(piece)
        self._buf = buf[len(piece):]
        return True

    def _call_step(self, final: bool) -> bool:
        buf = self._buf if self._junk else self._buf.lstrip()  # whitespace between tags is layout
        self._buf = buf
        if not buf or is_partial(buf, _CALL_TAGS):
            self._buf = "" if final else buf  # a tag cut off by the end of generation goes
            return False
        tag = next((t for t in _CALL_TAGS if buf.startswith(t)), None)
        if tag is None:
            return self._junk_step()
        if tag == PARAM:
            end = buf.find(">", len(PARAM))
            key = buf[len(PARAM):] if end < 0 else buf[len(PARAM):end]
            if "\n" in key or len(key) >= NAME_LIMIT:
                return self._junk_step()
            if end < 0:
                self._buf = "" if final else buf
                return False
            self._tag_seen()
            self.failures += self._function_closed  # a parameter after `</function>`
            self._function_closed = False
            self._key = key.strip()
            self._buf = buf[end + 1:]
            self._state = _State.VALUE
            self._scan = 0
            return True
        self._tag_seen()
        if tag != OPEN:
            self._buf = buf[len(tag):]
        if tag == FUNCTION_END and not self._function_closed:
            self._function_closed = True
        elif tag == CLOSE and self._function_closed:
            self._close_call()
        else:
            self.failures += 1  # a stray end tag, or `</function>`/`</tool_call>` missing
            if tag in (CLOSE, OPEN):
                self._close_call()  # a `<tool_call>` then starts the next call
        return True

    def _value_step(self, final: bool) -> bool:
        buf = self._buf
        i, tag = find_first(buf, _VALUE_ENDS, self._scan)
        if tag is None:
            if not final:
                self._scan = max(0, len(buf) - _VALUE_TAIL)
                return False
            self._buf = ""
            self._argument(buf[:len(buf) - partial_suffix(buf, _VALUE_ENDS)])  # cut off mid end tag
            self._state = _State.CALL
            return False
        if tag == PARAM_END:
            self._buf = buf[i + len(tag):]
        else:
            self.failures += 1  # `</parameter>` missing: the value ends where the next tag begins
            self._buf = buf[i:]
        self._argument(buf[:i])
        self._state = _State.CALL
        return True

    def _argument(self, raw: str) -> None:
        fragment, ok = self._args.add(self._key, raw)
        self.failures += not ok
        if fragment:
            self._out.append(Delta(tool_call=ToolCallDelta(index=self.calls, arguments=fragment)))
