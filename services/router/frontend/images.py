"""Image content parts of chat messages: OpenAI's `image_url` part and Anthropic's `image` block,
decoded with Pillow.

    {"type": "image_url", "image_url": {"url": "data:image/png;base64,...", "detail": "auto"}}
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "..."}}
    {"type": "image", "source": {"type": "url", "url": "https://..."}}

A `data:` URI (or a base64 source) carries the image as base64 PNG, JPEG or WebP. An http(s) URL is
fetched only when the router allows image URLs (`ImageLimits.allow_urls`), through the `fetch` it is
given; otherwise it is refused. Every image is held to the limits before and after decoding: its
bytes, its pixel count read from the header before the pixels are decoded (a small file can declare
a huge image), and its smallest side. A bad image (truncated, too small, over a limit, not an image)
is a 400 that names the part, `messages[i].content[j]`, and its field (`.image_url`, or the block's
`.source`). The digest names the image's bytes, for snapshot keys.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
from dataclasses import dataclass
from typing import Any, Callable

from PIL import Image

from common.vision.preprocess import to_rgb

from .errors import APIError, bad_request

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
MEDIA_TYPES = {"image/png", "image/jpeg", "image/jpg", "image/webp"}
DETAILS = {"auto", "low", "high"}
_DATA_URI = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,",
                       re.IGNORECASE)


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 << 20            # the encoded image, as the client sent it
    max_pixels: int = 64 << 20           # width x height as the header declares it
    min_side: int = 2                    # a 1-pixel side has nothing for a 16-pixel patch to see
    allow_urls: bool = False


@dataclass(frozen=True)
class DecodedImage:
    image: Image.Image                   # decoded, RGB (transparency composited onto white)
    format: str                          # PNG, JPEG or WEBP
    digest: str                          # blake2b of the encoded bytes
    nbytes: int

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def image_part(part: dict, where: str, limits: ImageLimits = ImageLimits(),
               fetch: Callable[[str, int], bytes] | None = None) -> DecodedImage:
    """One `image_url` content part -> the decoded image. `where` names it: `messages[2].content[1]`.
    `fetch(url, max_bytes)` reads an http(s) URL when limits allow them."""
    ref = part.get("image_url")
    if isinstance(ref, dict):
        url, detail = ref.get("url"), ref.get("detail", "auto")
    else:
        url, detail = ref, "auto"
    if not isinstance(url, str) or not url:
        raise bad_request(f"{where}.image_url.url must be a non-empty string", f"{where}.image_url")
    if detail not in DETAILS:
        raise bad_request(f"{where}.image_url.detail must be one of {', '.join(sorted(DETAILS))}",
                          f"{where}.image_url.detail")
    param = f"{where}.image_url"
    if url[:5].lower() == "data:":
        data = _data_uri(url, where, limits)
    elif re.match(r"^https?://", url, re.IGNORECASE):
        data = _fetch(url, where, param, limits, fetch, "send the image as a data: URI (base64 PNG, JPEG or WebP)")
    else:
        raise bad_request(f"{where}.image_url.url must be a data: URI or an http(s) URL", param)
    return decode_image(data, where, limits)


def is_image_block(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "image"


def image_block(block: dict, where: str, limits: ImageLimits = ImageLimits(),
                fetch: Callable[[str, int], bytes] | None = None) -> DecodedImage:
    """One Anthropic `image` block -> the decoded image, by the checks an image_url part has; the
    errors name the block's source, `messages[0].content[1].source`."""
    source, param = block.get("source"), f"{where}.source"
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not re.match(r"^https?://", url, re.IGNORECASE):
            raise bad_request(f"{param}.url must be an http(s) URL", f"{param}.url")
        data = _fetch(url, where, param, limits, fetch, "send the image as a base64 source (PNG, JPEG or WebP)")
        return decode_image(data, where, limits, param)
    if kind != "base64":
        raise bad_request(f"{param}.type must be 'base64' or 'url'", f"{param}.type")
    media, payload = source.get("media_type"), source.get("data")
    if not isinstance(media, str) or media.lower() not in MEDIA_TYPES:
        raise bad_request(f"{param}.media_type: {media!r} is not an image Fermium reads; send image/png, "
                          "image/jpeg or image/webp", f"{param}.media_type")
    if not isinstance(payload, str) or not payload:
        raise bad_request(f"{param}.data must be a non-empty base64 string", f"{param}.data")
    return decode_image(_base64(payload, where, f"{param}.data", limits, "source.data"), where, limits, param)


def _fetch(url: str, where: str, param: str, limits: ImageLimits, fetch, instead: str) -> bytes:
    if not limits.allow_urls or fetch is None:
        raise bad_request(f"{where}: image URLs are not fetched; {instead}, or start the router with "
                          "--allow-image-urls", param)
    try:
        return fetch(url, limits.max_bytes)
    except APIError:
        raise
    except Exception as e:
        raise bad_request(f"{where}: the image URL could not be read ({type(e).__name__}: {e})", param) from None


def _data_uri(url: str, where: str, limits: ImageLimits) -> bytes:
    m = _DATA_URI.match(url)
    param = f"{where}.image_url"
    if m is None or not m.group("b64"):
        raise bad_request(f"{where}: a data: URI image must be base64 (data:image/png;base64,...)", param)
    media = (m.group("type") or "").lower()
    if media not in MEDIA_TYPES:
        raise bad_request(f"{where}: media type {media or 'none'!r} is not an image Fermium reads; send PNG, "
                          "JPEG or WebP", param)
    return _base64(url[m.end():], where, param, limits, "the data: URI")


def _base64(payload: str, where: str, param: str, limits: ImageLimits, what: str) -> bytes:
    if len(payload) // 4 * 3 > limits.max_bytes + 2:          # before decoding it
        raise _too_large(where, len(payload) // 4 * 3, limits, param)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where}: {what} is not valid base64", param) from None


def _too_large(where: str, nbytes: int, limits: ImageLimits, param: str) -> APIError:
    return APIError(400, f"{where}: the image is {nbytes} bytes, over the limit of {limits.max_bytes}",
                    param=param, code="image_too_large")


def decode_image(data: bytes, where: str, limits: ImageLimits = ImageLimits(),
                 param: str | None = None) -> DecodedImage:
    """Encoded bytes -> the decoded RGB image, held to the limits. `param`: the field errors name
    (default `{where}.image_url`)."""
    param = param or f"{where}.image_url"
    if len(data) > limits.max_bytes:
        raise _too_large(where, len(data), limits, param)
    try:
        image = Image.open(io.BytesIO(data), formats=list(FORMATS))
    except Image.UnidentifiedImageError:
        raise bad_request(f"{where}: not a PNG, JPEG or WebP image", param, "invalid_image") from None
    except Image.DecompressionBombError as e:
        raise APIError(400, f"{where}: the image declares too many pixels ({e})", param=param,
                       code="image_too_large") from None
    except Exception as e:
        raise bad_request(f"{where}: the image cannot be read ({type(e).__name__}: {e})", param,
                          "invalid_image") from None
    width, height = image.size
    if width * height > limits.max_pixels:
        raise APIError(400, f"{where}: the image is {width}x{height} pixels, over the limit of {limits.max_pixels}",
                       param=param, code="image_too_large")
    if min(width, height) < limits.min_side:
        raise bad_request(f"{where}: the image is {width}x{height} pixels; each side must be at least "
                          f"{limits.min_side}", param, "invalid_image")
    try:
        image.load()
        rgb = to_rgb(image)
    except Exception as e:
        # truncated or corrupt pixel data: Pillow finds it only while decoding
        raise bad_request(f"{where}: the image is damaged or cut short ({type(e).__name__}: {e})", param,
                          "invalid_image") from None
    return DecodedImage(rgb, image.format, hashlib.blake2b(data, digest_size=16).hexdigest(), len(data))


def fetch_url(url: str, max_bytes: int, timeout_s: float = 10.0, client=None) -> bytes:
    """GET an http(s) image, reading at most max_bytes + 1 bytes of it (then refused by decode_image)."""
    import httpx
    own = client is None
    client = client or httpx.Client(timeout=timeout_s, follow_redirects=True, max_redirects=3)
    try:
        with client.stream("GET", url) as reply:
            reply.raise_for_status()
            out = bytearray()
            for chunk in reply.iter_bytes():
                out += chunk
                if len(out) > max_bytes:
                    break
            return bytes(out)
    finally:
        if own:
            client.close()
