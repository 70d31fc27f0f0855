"""services/router/frontend/images.py: image_url content parts, decoded with Pillow and held to the limits."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from services.router.frontend.errors import APIError
from services.router.frontend.images import ImageLimits, decode_image, fetch_url, image_part, is_image_part

from .vision_helpers import synthetic_image

Image = pytest.importorskip("PIL.Image")
WHERE = "messages[2].content[1]"


def encoded(height=40, width=60, fmt="PNG", mode="RGB", **save) -> bytes:
    pixels = synthetic_image(height, width, 0)
    image = Image.fromarray(pixels, "RGB")
    if mode != "RGB":
        image = image.convert(mode)
    out = io.BytesIO()
    image.save(out, format=fmt, **save)
    return out.getvalue()


def part(data: bytes, media: str = "image/png", **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{media};base64," + base64.b64encode(data).decode(),
                                               **extra}}


def refused(p, limits=ImageLimits(), fetch=None) -> APIError:
    with pytest.raises(APIError) as info:
        image_part(p, WHERE, limits, fetch)
    assert info.value.status == 400
    assert WHERE in info.value.message and info.value.param.startswith(WHERE)
    return info.value


@pytest.mark.parametrize("fmt,media", [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_png_jpeg_and_webp_decode(fmt, media):
    data = encoded(fmt=fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    got = image_part(part(data, media), WHERE)
    assert got.format == fmt and got.size == (60, 40) and got.image.mode == "RGB"
    assert got.nbytes == len(data)
    if fmt != "JPEG":
        assert np.array_equal(np.asarray(got.image), synthetic_image(40, 60, 0))


def test_the_digest_names_the_bytes():
    a, b = image_part(part(encoded()), WHERE), image_part(part(encoded()), WHERE)
    c = image_part(part(encoded(41, 60)), WHERE)
    assert a.digest == b.digest != c.digest


def test_transparency_goes_onto_white():
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 0))
    out = io.BytesIO()
    rgba.save(out, format="PNG")
    got = image_part(part(out.getvalue()), WHERE)
    assert got.image.mode == "RGB" and got.image.getpixel((0, 0)) == (255, 255, 255)


def test_a_string_image_url_and_the_part_test():
    p = {"type": "image_url", "image_url": "data:image/png;base64," + base64.b64encode(encoded()).decode()}
    assert is_image_part(p) and not is_image_part({"type": "text", "text": "x"})
    assert image_part(p, WHERE).size == (60, 40)


def test_a_truncated_image_is_refused():
    data = encoded(200, 200)
    e = refused(part(data[: len(data) // 2]))
    assert e.code == "invalid_image" and "cut short" in e.message


def test_a_one_pixel_image_is_refused():
    e = refused(part(encoded(1, 1)))
    assert "1x1" in e.message


def test_not_an_image_is_refused():
    assert "not a PNG, JPEG or WebP" in refused(part(b"hello, this is text", "image/png")).message
    gif = io.BytesIO()
    Image.new("RGB", (8, 8)).save(gif, format="GIF")
    assert "not a PNG, JPEG or WebP" in refused(part(gif.getvalue(), "image/png")).message
    assert "media type" in refused(part(encoded(), "text/plain")).message
    assert "base64" in refused({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}}).message
    assert "base64" in refused({"type": "image_url", "image_url": {"url": "data:image/png,abc"}}).message
    assert "data: URI or an http(s) URL" in refused({"type": "image_url", "image_url": {"url": "file:///x"}}).message
    assert "non-empty" in refused({"type": "image_url", "image_url": {}}).message
    assert "detail" in refused(part(encoded(), detail="ultra")).message


def test_the_limits():
    data = encoded(100, 100)
    e = refused(part(data), ImageLimits(max_bytes=len(data) - 1))
    assert e.code == "image_too_large" and str(len(data) - 1) in e.message
    e = refused(part(encoded(100, 100)), ImageLimits(max_pixels=100 * 100 - 1))
    assert e.code == "image_too_large" and "100x100" in e.message
    assert image_part(part(data), WHERE, ImageLimits(max_bytes=len(data), max_pixels=100 * 100)).size == (100, 100)


def forged_png(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares width x height pixels."""
    import struct
    import zlib
    small = encoded(8, 8)
    at = small.index(b"IHDR")
    body = b"IHDR" + struct.pack(">II", width, height) + small[at + 12:at + 17]
    return small[:at - 4] + struct.pack(">I", 13) + body + struct.pack(">I", zlib.crc32(body)) + small[at + 21:]


def test_a_small_file_that_declares_a_huge_image_is_refused_before_decoding():
    e = refused(part(forged_png(3000, 2000)), ImageLimits(max_pixels=1 << 20))
    assert e.code == "image_too_large" and "3000x2000" in e.message
    assert refused(part(forged_png(30000, 30000))).code == "image_too_large"     # Pillow's bomb guard


def test_urls_are_refused_unless_allowed():
    url = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    assert "--allow-image-urls" in refused(url).message
    data = encoded()
    got = image_part(url, WHERE, ImageLimits(allow_urls=True), fetch=lambda u, n: data)
    assert got.size == (60, 40)

    def broken(u, n):
        raise ConnectionError("no route to host")
    assert "could not be read" in refused(url, ImageLimits(allow_urls=True), broken).message


def test_fetch_url_stops_at_the_limit():
    httpx = pytest.importorskip("httpx")
    data = encoded(100, 100)
    client = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200, content=data)))
    assert fetch_url("https://example.com/a.png", len(data), client=client) == data
    cut = fetch_url("https://example.com/a.png", 100, client=client)
    assert 100 < len(cut) <= len(data)
    with pytest.raises(APIError, match="over the limit"):
        decode_image(cut, WHERE, ImageLimits(max_bytes=100))
    missing = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
    with pytest.raises(httpx.HTTPStatusError):
        fetch_url("https://example.com/a.png", 100, client=missing)
