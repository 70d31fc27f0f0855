"""OpenAI request bodies -> a validated Job: fields, types, ranges, model, context length.

Fields OpenAI documents are accepted; those Fermium cannot honour are refused when set to a
value that would change the answer (suffix, best_of other than n). The sampling fields, logprobs
and logit_bias among them, are read in sampling_args.py. A field OpenAI does not know
is refused, as OpenAI does, except the sampling extensions vLLM accepts too. Chat messages are
checked in messages.py; tools and tool_choice, and the prompt they steer, in tools.py;
`response_format` and a forced tool_choice become the request's grammar (structured.py); `n` > 1
asks for that many choices, which share the prompt's prefill (engine/copies.py). With a vision tower
(`vision`, vision.py), `image_url` parts of user messages become their images' runs of image tokens.

The body as a whole is checked before any field is read: valid UTF-8 and JSON, nesting at most
MAX_DEPTH deep, no lone surrogate in any string, every float finite (Python's json reads `NaN`,
`Infinity` and `1e400`), every integer within int64 (what msgpack carries to the workers).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from common.grammar import Vocab
from common.model.template_tokens import TemplateTokens
from common.model.token_budget import PromptTooLong
from common.sampling import SamplingParams

from ..engine import MAX_CHOICES, PromptImages, Request
from .errors import APIError, bad_request
from .images import is_image_part
from .messages import chat_messages
from .sampling_args import INT64, sampling_params
from .sampling_args import number as _num
from .structured import request_grammar
from .tools import ToolPlan, steer, tool_plan
from .vision import ImageReads, VisionInput

COMMON_FIELDS = {"model", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
                 "presence_penalty", "seed", "stop", "stream", "stream_options", "temperature",
                 "top_p", "user", "metadata", "store", "service_tier"}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "top_logprobs", "response_format",
                               "tools", "tool_choice", "parallel_tool_calls", "modalities", "audio",
                               "prediction", "reasoning_effort", "web_search_options", "function_call",
                               "functions", "verbosity", "safety_identifier", "prompt_cache_key"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "best_of", "echo", "suffix", "response_format"}
EXTENSION_FIELDS = {"top_k", "min_p", "repetition_penalty", "chat_template_kwargs"}
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")    # "none" turns thinking off
MAX_STOP_STRINGS = 4
MAX_DEPTH = 64                  # JSON nesting; real requests stay under 10
TEMPLATE_FLAGS = ("enable_thinking", "preserve_thinking")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Job:
    """One validated generation request, in tokens."""

    chat: bool
    model: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    tools: ToolPlan = ToolPlan()
    reasoning: bool = False         # the answer opens inside a think block the prompt left open
    forced: str = ""                # the start of the answer the prompt already holds
    echo: str = ""                  # a completion's prompt text, sent before its answer
    n: int = 1                      # choices, each its own sequence from the one prefill
    images: PromptImages | None = None   # the prompt's images, where its image tokens are

    def request(self) -> Request:
        """What the engine runs of it."""
        return Request(self.prompt_ids, self.max_tokens, self.sampling, self.stop, self.n, self.images)


def parse_body(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not valid UTF-8 (byte {e.start})") from None
    try:
        body = json.loads(text)
    except RecursionError:
        raise bad_request(f"the request body is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:                        # JSONDecodeError, or an integer of over 4300 digits
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _check_tree(body)
    return body


def _check_tree(body: dict) -> None:
    """Depth, strings, floats and integers of the whole body, without recursion."""
    pending: list[tuple[Any, tuple, int]] = [(body, (), 0)]
    while pending:
        value, path, depth = pending.pop()
        if isinstance(value, str):
            if not value.isascii() and _SURROGATE.search(value):
                raise bad_request(f"'{_name(path)}' holds a lone UTF-16 surrogate, which is not text", _name(path))
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not INT64[0] <= value < INT64[1]:
                raise bad_request(f"'{_name(path)}' does not fit a 64-bit integer", _name(path))
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise bad_request(f"'{_name(path)}' is {value}; numbers must be finite", _name(path))
        elif depth >= MAX_DEPTH:
            raise bad_request(f"the request body is nested deeper than {MAX_DEPTH} levels", _name(path))
        elif isinstance(value, dict):
            for k, v in value.items():
                if not k.isascii() and _SURROGATE.search(k):
                    raise bad_request(f"a key in '{_name(path)}' holds a lone UTF-16 surrogate", _name(path))
                pending.append((v, (*path, k), depth + 1))
        else:
            pending.extend((v, (*path, i), depth + 1) for i, v in enumerate(value))


def _name(path: tuple) -> str:
    """('messages', 0, 'content') -> 'messages[0].content'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or "body"


def _refuse_unsupported(body: dict, max_n: int) -> None:
    n = _num(body, "n", int, 1, lambda v: 1 <= v <= max_n, f"in [1, {max_n}] (the server's --max-n)")
    if body.get("best_of") not in (None, n):
        raise bad_request("only best_of equal to n is supported", "best_of")
    if body.get("suffix"):
        raise bad_request("'suffix' is not supported", "suffix")
    for name in ("functions", "function_call"):
        if body.get(name) is not None:
            raise bad_request(f"'{name}' is deprecated and not supported; send 'tools' and 'tool_choice'", name)


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request("'stop' must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"'stop' takes at most {MAX_STOP_STRINGS} strings", "stop")
    return tuple(stops)


def _prompt(body: dict, encode: Callable[[str], list[int]], vocab: int) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(0 <= t < vocab for t in prompt):
            raise bad_request(f"'prompt' token ids must be in [0, {vocab})", "prompt")
        return list(prompt)
    raise bad_request("'prompt' must be a string, a list of one string, or a list of token ids", "prompt")


def _template_kwargs(body: dict) -> dict:
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    for key, value in kwargs.items():
        if not key.isidentifier():
            raise bad_request(f"chat_template_kwargs: {key!r} is not a template variable name",
                              f"chat_template_kwargs.{key}")
        if key in TEMPLATE_FLAGS and not isinstance(value, bool):
            raise bad_request(f"chat_template_kwargs.{key} must be a boolean", f"chat_template_kwargs.{key}")
    return kwargs


def chat_prompt(body: dict, plan: ToolPlan, render: Callable[[list[dict], dict], str],
                prefill: str = "", read_image=None,
                template: TemplateTokens | None = None) -> tuple[str, bool]:
    """The rendered, steered prompt and whether the answer opens in a think block. `prefill` is the
    start of the answer written by the client, which the answer continues after any reasoning;
    `read_image(part, where)` takes an image part's place (messages.py); `template`: the client's
    strings are escaped so that only the template places control tokens (template_tokens.py)."""
    def escape(value):
        return template.escape(value, is_image_part) if template is not None else value
    variables = escape(dict(_template_kwargs(body)))
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise bad_request(f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}", "reasoning_effort")
    if effort == "none":                   # an explicit chat_template_kwargs.enable_thinking wins
        variables.setdefault("enable_thinking", False)
    variables["tools"] = escape(list(plan.tools)) or None    # the request's, never a template kwarg's
    try:
        text = render(chat_messages({**body, "messages": escape(body.get("messages"))}, read_image), variables)
    except ValueError as e:                      # the chat template refused the conversation
        raise bad_request(str(e), "messages") from None
    if prefill:
        text, _ = steer(text, escape(prefill))
    return steer(text, plan.forced)


def check_model(model: str, served: tuple[str, ...]) -> None:
    if model not in served:
        raise APIError(404, f"The model `{model}` does not exist; this server serves `{served[0]}`",
                       param="model", code="model_not_found")


def _echo(body: dict, prompt_ids: list[int], decode: Callable[[list[int]], str] | None) -> str:
    """The prompt as text: as sent, or its token ids detokenized."""
    echo = body.get("echo")
    if echo is None or echo is False:
        return ""
    if not isinstance(echo, bool):
        raise bad_request("'echo' must be a boolean", "echo")
    prompt = body["prompt"]
    if isinstance(prompt, list) and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if decode is None:
        raise bad_request("'echo' of a token-id prompt needs the server's tokenizer", "echo")
    return decode(prompt_ids)


def validate(body: dict, *, chat: bool, served: tuple[str, ...], context: int, vocab: int,
             encode: Callable[[str], list[int]], render: Callable[[list[dict], dict], str],
             decode: Callable[[list[int]], str] | None = None, prefill: str = "", clamp: bool = False,
             tokenizer: Vocab | None = None, vision: VisionInput | None = None,
             template: TemplateTokens | None = None, max_n: int = MAX_CHOICES) -> Job:
    """`template`: a chat prompt's client text is tokenized as text (None: `encode` parses it);
    `prefill`: the start of the answer the client wrote (chat_prompt); `clamp`: a max_tokens past
    the context is cut to what is left, where the Anthropic API asks for it; `tokenizer`: what
    grammars are built on (structured.py); `vision`: the reader of image parts (None: refused);
    `max_n`: the largest `n` (--max-n)."""
    allowed = (CHAT_FIELDS if chat else COMPLETION_FIELDS) | EXTENSION_FIELDS
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(f"Unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])
    model = body.get("model")
    if not isinstance(model, str):
        raise bad_request("'model' is required", "model")
    check_model(model, served)
    _refuse_unsupported(body, max_n)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    sampling = sampling_params(body, chat=chat, vocab=vocab)
    plan, reasoning, images = ToolPlan(), False, None
    try:                        # refused by its bytes, or once past the context (token_budget.py)
        if chat:
            plan = tool_plan(body)
            reads = ImageReads(vision)
            text, reasoning = chat_prompt(body, plan, render, prefill, reads if vision is not None else None, template)
            prompt_ids = template.encode(text, context) if template is not None else encode(text)
            if reads.read:
                prompt_ids, images = vision.expand(prompt_ids, reads.read)
        else:
            prompt_ids = _prompt(body, encode, vocab)
    except PromptTooLong as e:
        raise bad_request(f"the prompt is more than {context} tokens (at least {e.at_least}); this model's context "
                          f"limit is {context} tokens, and at least one must be left to generate",
                          "messages" if chat else "prompt", code="context_length_exceeded") from None
    grammar = request_grammar(body, plan, tokenizer, reasoning)
    if grammar:
        sampling = dataclasses.replace(sampling, grammar=grammar)
    if not prompt_ids:
        raise bad_request("the prompt is empty", "messages" if chat else "prompt")
    room = context - len(prompt_ids)
    if room <= 0:
        raise bad_request(f"the prompt is {len(prompt_ids)} tokens; this model's context limit is {context} "
                          "tokens, and at least one must be left to generate", "messages" if chat else "prompt",
                          code="context_length_exceeded")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _num(body, name, int, room if chat else 16, lambda v: v >= 1, ">= 1")
    if max_tokens > room and clamp:
        max_tokens = room
    elif max_tokens > room:
        raise bad_request(f"the prompt ({len(prompt_ids)} tokens) plus {name} ({max_tokens}) exceeds this "
                          f"model's context limit of {context} tokens", name, code="context_length_exceeded")
    echo = "" if chat else _echo(body, prompt_ids, decode)
    if echo and sampling.logprobs:
        raise bad_request("'echo' with 'logprobs' is not supported: the prompt's logprobs are not computed", "echo")
    return Job(chat, model, tuple(prompt_ids), max_tokens, sampling, _stop(body), stream,
               bool(options.get("include_usage")), plan, reasoning, plan.forced, echo, body.get("n") or 1, images)
