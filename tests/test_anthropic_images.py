"""Anthropic image blocks on /v1/messages (services/router/frontend/anthropic_images.py, images.py image_block):
the official `anthropic` client sends a base64 image to the in-process stack under uvicorn and gets
the reference model's greedy text on the same prompt (tests/test_vision_serving.py's tiny model and
reference); count_tokens counts the image's run of tokens; a URL source is read only with
--allow-image-urls; and every bad image or block is a 400 in Anthropic's error shape that names the
block as the request has it, `messages[i].content[j]`, behind a system prompt and earlier turns that
move its place in the translated chat body."""
from __future__ import annotations

import base64

import pytest
from starlette.testclient import TestClient

from services.router.frontend.anthropic_images import AnthropicVision, ImageBlock, user_content
from services.router.frontend.errors import APIError
from services.router.frontend.images import ImageLimits, image_block
from tests.http_helpers import serve_app

from .test_vision_serving import MAX_TOKENS, MODEL, make_app, png, reference_answer, vl  # noqa: F401
from .vision_helpers import IMAGE_PAD

WHERE = "messages[2].content[1]"


def source(data: bytes, media: str = "image/png") -> dict:
    return {"type": "base64", "media_type": media, "data": base64.b64encode(data).decode()}


def block(data: bytes, media: str = "image/png") -> dict:
    return {"type": "image", "source": source(data, media)}


def body(image: dict, text: str = "what is this? ", after: str = " tell me") -> dict:
    """The image is the second block of the third message, behind a system prompt."""
    return {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0, "system": "be brief",
            "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                         {"role": "user", "content": [{"type": "text", "text": text}, image,
                                                      {"type": "text", "text": after}]}]}


def text_of(reply: dict) -> str:
    return "".join(b["text"] for b in reply["content"] if b["type"] == "text")


@pytest.fixture(scope="module")
def client(vl):  # noqa: F811
    app, dispatcher, _ = make_app(vl, cache=False)
    with TestClient(app) as c:
        c.dispatcher = dispatcher
        yield c


# ---- through the stack


def test_the_anthropic_client_sends_an_image(vl):  # noqa: F811
    anthropic = pytest.importorskip("anthropic")
    image = png(200, 120, seed=5)
    want, ids = reference_answer(vl, ["describe ", image])
    app, dispatcher, _ = make_app(vl, cache=False)
    with serve_app(app) as url:
        api = anthropic.Anthropic(base_url=url, api_key="none")
        reply = api.messages.create(model=MODEL, max_tokens=MAX_TOKENS, extra_body={"temperature": 0}, messages=[
            {"role": "user", "content": [{"type": "text", "text": "describe "}, block(image)]}])
        counted = api.messages.count_tokens(model=MODEL, messages=[
            {"role": "user", "content": [{"type": "text", "text": "describe "}, block(image)]}])
    assert "".join(b.text for b in reply.content if b.type == "text") == want and want
    assert reply.usage.input_tokens == len(ids) == counted.input_tokens
    assert dispatcher.metrics.images._value.get() == 1
    assert dispatcher.metrics.image_tokens._value.get() == ids.count(IMAGE_PAD)


def test_an_image_behind_other_turns_answers_as_the_openai_route(client):
    image = png(64, 96, seed=1)
    r = client.post("/v1/messages", json=body(block(image)))
    assert r.status_code == 200, r.text
    openai = {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0,
              "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"},
                           {"role": "assistant", "content": "hi"},
                           {"role": "user", "content": [
                               {"type": "text", "text": "what is this? "},
                               {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                   + base64.b64encode(image).decode()}},
                               {"type": "text", "text": " tell me"}]}]}
    o = client.post("/v1/chat/completions", json=openai)
    assert o.status_code == 200, o.text
    assert text_of(r.json()) == o.json()["choices"][0]["message"]["content"]
    assert r.json()["usage"]["input_tokens"] == o.json()["usage"]["prompt_tokens"]
    counted = client.post("/v1/messages/count_tokens", json={k: v for k, v in body(block(image)).items()
                                                             if k not in ("max_tokens", "temperature")})
    assert counted.status_code == 200 and counted.json()["input_tokens"] == r.json()["usage"]["input_tokens"]


def test_url_sources_are_read_only_when_allowed(vl):  # noqa: F811
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route
    image = png(64, 96, seed=7)
    want, _ = reference_answer(vl, ["what is this? ", image, " tell me"])
    files = Starlette(routes=[Route("/cat.png", lambda request: Response(image, media_type="image/png"))])
    with serve_app(files) as base:
        url_body = body({"type": "image", "source": {"type": "url", "url": base + "/cat.png"}})
        url_body["system"], url_body["messages"] = None, url_body["messages"][2:]
        for allow in (False, True):
            app, _, _ = make_app(vl, cache=False, allow_urls=allow)
            with TestClient(app) as c:
                r = c.post("/v1/messages", json=url_body)
            if allow:
                assert r.status_code == 200 and text_of(r.json()) == want
            else:
                error = refused_reply(r)
                assert "messages[0].content[1]" in error and "--allow-image-urls" in error


# ---- bad input


def refused_reply(r) -> str:
    assert r.status_code == 400, r.text
    reply = r.json()
    assert set(reply) == {"type", "error"} and reply["type"] == "error"
    assert reply["error"]["type"] == "invalid_request_error"
    return reply["error"]["message"]


def _gif() -> bytes:
    import io

    from PIL import Image
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, format="GIF")
    return out.getvalue()


BAD = {
    "truncated": (lambda: block(png(200, 200, 0)[:2000]), "damaged or cut short"),
    "one pixel": (lambda: block(png(1, 1, 0)), "1x1"),
    "not an image": (lambda: block(b"hello, this is text"), "not a PNG, JPEG or WebP"),
    "a gif": (lambda: block(_gif(), "image/gif"), "'image/gif' is not an image Fermium reads"),
    "bad base64": (lambda: {"type": "image", "source": {**source(b"x"), "data": "@@@@"}}, "not valid base64"),
    "empty data": (lambda: {"type": "image", "source": {**source(b"x"), "data": ""}}, "non-empty base64"),
    "a file source": (lambda: {"type": "image", "source": {"type": "file", "file_id": "f"}}, "'base64' or 'url'"),
    "no source": (lambda: {"type": "image"}, "'base64' or 'url'"),
    "a file URL": (lambda: {"type": "image", "source": {"type": "url", "url": "file:///x"}}, "http(s) URL"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_image_is_a_400_naming_its_block(client, case):
    make, says = BAD[case]
    message = refused_reply(client.post("/v1/messages", json=body(make())))
    assert message.startswith(WHERE) and says in message
    assert message.count(WHERE) == 1                                  # named once, not once per layer
    counted = client.post("/v1/messages/count_tokens", json={"model": MODEL, **{
        k: v for k, v in body(make()).items() if k in ("system", "messages")}})
    assert says in refused_reply(counted)


def test_images_elsewhere_or_without_a_tower_are_refused_by_name(vl, client):  # noqa: F811
    image = block(png(64, 96, 0))
    turn = body(image)
    turn["messages"][1]["content"] = [{"type": "text", "text": "hi"}, image]
    assert "messages[1].content[1].type" in refused_reply(client.post("/v1/messages", json=turn))
    app, _, _ = make_app(vl, mmproj=False, cache=False)
    with TestClient(app) as c:
        message = refused_reply(c.post("/v1/messages", json=body(image)))
    assert message.startswith(WHERE) and "without --mmproj" in message


# ---- the pieces


def test_image_block_limits_and_fields():
    data = png(100, 100, 0)
    assert image_block(block(data), WHERE).size == (100, 100)
    for limit, param in ((len(data) // 2, f"{WHERE}.source.data"), (len(data) - 1, f"{WHERE}.source")):
        with pytest.raises(APIError) as e:     # before decoding the base64, then after it
            image_block(block(data), WHERE, ImageLimits(max_bytes=limit))
        assert e.value.code == "image_too_large" and e.value.param == param and str(limit) in e.value.message
    with pytest.raises(APIError) as e:
        image_block(block(data), WHERE, ImageLimits(max_pixels=100 * 100 - 1))
    assert e.value.code == "image_too_large" and "100x100" in e.value.message and e.value.param == f"{WHERE}.source"
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    got = image_block(url, WHERE, ImageLimits(allow_urls=True), fetch=lambda u, n: data)
    assert got.size == (100, 100) and got.digest == image_block(block(data), WHERE).digest


def test_user_content_keeps_text_as_text_blocks_join():
    image = ImageBlock(block(b"x"), WHERE)
    assert user_content(["a", "b"], "\n\n") == "a\n\nb"
    assert user_content(["a", "b", image, "c"], "\n\n") == [{"type": "text", "text": "a\n\nb"}, image,
                                                           {"type": "text", "text": "c"}]
    with pytest.raises(APIError, match="only image blocks"):
        AnthropicVision(None).read({"type": "image_url"}, "messages[0].content[0]")
