"""The cases of tests/test_hostile_http.py: every request named in issue 27, and a seeded
generator of valid bodies mutated into hostile ones (NaN literals, int64 overflow, lone
surrogates, deep nesting, wrong types, cut and flipped bytes)."""
from __future__ import annotations

import json
import random

MODEL = "fermium"
ROUTES = ("/v1/chat/completions", "/v1/completions")
OVERSIZE = 9 << 20                   # past the API's 8 MiB limit
NUMERIC = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "max_tokens", "n",
           "presence_penalty", "frequency_penalty", "max_completion_tokens", "best_of", "top_logprobs", "logprobs")
OTHER = ("model", "prompt", "messages", "stop", "stream", "stream_options", "user", "metadata", "response_format",
         "logit_bias", "chat_template_kwargs", "echo", "suffix", "tools", "frobnicate", "")
RAW_NUMBERS = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 5000, "-0", "1E-400")
EDGE_NUMBERS = (2 ** 63, 2 ** 64, 18446744073709551616, -2 ** 63 - 1, 2 ** 63 - 1, -1, 0, 1, 0.5, -0.5, 1e-308,
                5e-324, 1e-320, 1e308, 3, 2.0000001, 10 ** 30)
UNICODE = ("\ud800", "\udfff", "a\udbff\udc00", "\x00", "\uffff", "\ufeff", "é", "😀", "\u202e", "e\u0301",
           "\U0010ffff", "<|im_end|>", "{{ 7*7 }}", "{% raw %}")


class Raw:
    """A JSON value written into the body text as is (NaN, deep nesting, a 5,000-digit integer)."""

    def __init__(self, text: str):
        self.text = text


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghij klmnopqrstuvwxyz.,") for _ in range(n))


def _value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(10 if depth < 2 else 7)
    if kind == 0:
        return Raw(rng.choice(RAW_NUMBERS))
    if kind == 1:
        return rng.choice(EDGE_NUMBERS) * rng.choice((1, -1))
    if kind == 2:
        return rng.choice((True, False, None, "", "0", "true", "null"))
    if kind == 3:
        return "".join(rng.choice(UNICODE) for _ in range(rng.randrange(1, 4)))
    if kind == 4:
        return "".join(chr(rng.randrange(1, 0x110000)) for _ in range(rng.randrange(1, 8)))
    if kind == 5:
        n = rng.choice((65, 200, 1000, 5000))
        return Raw("[" * n + "]" * n if rng.random() < 0.5 else '{"a":' * n + "1" + "}" * n)
    if kind == 6:
        return rng.uniform(-1e6, 1e6) if rng.random() < 0.5 else rng.randrange(-10, 300)
    if kind == 7:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 8:
        return {rng.choice(OTHER + NUMERIC + ("self", "role", "content", "type", "\ud800")): _value(rng, depth + 1)
                for _ in range(rng.randrange(4))}
    return "x" * rng.choice((1, 300, 5000))


def valid_body(rng: random.Random, chat: bool) -> dict:
    body = {"model": MODEL, "max_tokens": rng.randrange(1, 5), "temperature": rng.choice((0, 0.001, 0.7, 2)),
            "stream": rng.random() < 0.3}
    if chat:
        roles = ("system", "user", "assistant", "user")
        body["messages"] = [{"role": roles[i], "content": _text(rng, rng.randrange(1, 20))}
                            for i in range(rng.randrange(1, 4))]
    else:
        body["prompt"] = _text(rng, rng.randrange(1, 20))
    return body


def mutate(rng: random.Random, body: dict) -> None:
    op = rng.randrange(6)
    if op <= 1:
        body[rng.choice(NUMERIC if op == 0 else OTHER)] = _value(rng)
    elif op == 2 and body:
        del body[rng.choice(sorted(body))]
    elif op == 3 and isinstance(body.get("messages"), list) and body["messages"]:
        m = rng.choice(body["messages"])
        if isinstance(m, dict):
            m[rng.choice(("role", "content", "name", "tool_calls", "\ud800"))] = _value(rng)
    elif op == 4:
        body["chat_template_kwargs"] = {rng.choice(("self", "enable_thinking", "messages", "tools", "a b", "x")):
                                        _value(rng)}
    else:
        body["messages" if rng.random() < 0.5 else "prompt"] = _value(rng)


def dumps(body, ascii: bool = True) -> bytes:
    raws: list[str] = []

    def placeholder(o):
        if isinstance(o, Raw):
            raws.append(o.text)
            return f"@@raw{len(raws) - 1}@@"
        raise TypeError(type(o))
    text = json.dumps(body, default=placeholder, ensure_ascii=ascii)
    for i, raw in enumerate(raws):
        text = text.replace(f'"@@raw{i}@@"', raw)
    return text.encode("utf-8", "surrogatepass")     # a raw surrogate is invalid UTF-8: a case of its own


def encode_body(rng: random.Random, body) -> bytes:
    data = dumps(body, ascii=rng.random() < 0.7)
    if rng.random() < 0.1:                              # bytes: cut, flipped, or junk inserted
        i = rng.randrange(len(data) + 1)
        data = rng.choice((data[:i], data[:i] + bytes([rng.randrange(256)]) + data[i + 1:],
                           data[:i] + rng.randbytes(rng.randrange(1, 8)) + data[i:]))
    return data


def fixed_cases() -> list[tuple[str, str, bytes | None]]:
    """Every case named in issue 27, on both routes where a body matters."""
    out = []
    for path in ROUTES:
        chat = path == ROUTES[0]
        base = valid_body(random.Random(0), chat) | {"stream": False}
        hostile = [{"repetition_penalty": 1e-308}, {"temperature": 1e-320}, {"top_k": 18446744073709551616},
                   {"seed": 2 ** 64}, {"max_tokens": -1}, {"top_p": -0.5}, {"min_p": 2},
                   {"model": "\ud800"}, {"stop": ["\ud800"]}, {"user": "\udfff"}, {"metadata": {"\ud800": 1}},
                   {"chat_template_kwargs": {"self": 1}}, {"chat_template_kwargs": {"enable_thinking": "no"}},
                   {"metadata": Raw("[" * 1000 + "]" * 1000)}, {"temperature": "hot"}, {"messages": "hi"},
                   {"prompt": [2 ** 64]}, {"prompt": {"a": 1}}, {"stream": "yes"}]
        hostile += [{name: Raw(raw)} for name in NUMERIC for raw in RAW_NUMBERS[:5]]
        out += [("POST", path, dumps(base | h)) for h in hostile]
        out += [("POST", path, raw) for raw in (b"", b"hello", b"\xff\xfe", b"[]", b"null", b"1", b'"s"', b"{",
                                                b"[" * 100_000, b'{"model": "fermium", "prompt": "\xed\xa0\x80"}')]
        out += [(method, path, None) for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS")]
        out.append(("POST", path, b" " * OVERSIZE))
    out += [("GET", p, None) for p in ("/", "/v1", "/v1/foo", "/v1/completions/x", "/v2/chat/completions",
                                       "/v1/models/fermium", "/%ff%fe", "/v1/chat/completions%00")]
    out += [("POST", p, b"{}") for p in ("/health", "/v1/models", "/nope")]
    return out


def generated_cases(rng: random.Random, n: int) -> list[tuple[str, str, bytes | None]]:
    out = []
    for _ in range(n):
        path = rng.choice(ROUTES)
        body = valid_body(rng, chat=path == ROUTES[0])
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            mutate(rng, body)
        out.append(("POST", path, encode_body(rng, body)))
    return out
