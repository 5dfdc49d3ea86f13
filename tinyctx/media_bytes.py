"""Reading a part's bytes: strict base64, digests, checked fields, an image's pixel size
from its header and a PDF's page count, without decoding pixels."""

from __future__ import annotations

import binascii
import hashlib
import re
import struct

from .config import integer, optional
from .errors import ConfigError

__all__ = ["image_size", "pdf_pages"]


def preview_of(value: str, limit: int = 40) -> str:
    """A short stand-in for a possibly huge string in an error message."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}... ({len(value)} chars)"


def decode_base64(owner: str, value: object) -> bytes:
    if not isinstance(value, str):
        raise ConfigError("data", type(value).__name__, "a base64 string", owner=owner)
    if not value:
        raise ConfigError("data", value, "a non-empty base64 string", owner=owner)
    if value.startswith("data:"):
        raise ConfigError(
            "data",
            preview_of(value),
            "plain base64 without a 'data:' prefix (use from_data_url for data URLs)",
            owner=owner,
        )
    try:
        return binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigError(
            "data", preview_of(value), f"valid base64 (RFC 4648, no whitespace): {exc}", owner=owner
        ) from None


def digest_of(raw: bytes) -> str:
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def optional_text(owner: str, name: str, value: object, *, nonempty: bool = True) -> None:
    if value is None:
        return
    if not isinstance(value, str) or (nonempty and not value):
        raise ConfigError(name, value, "None or a non-empty string", owner=owner)


def checked_url(owner: str, value: object) -> None:
    """A part's URL: a non-empty string a provider can send (no lone surrogate, which no
    UTF-8 encoder accepts)."""
    optional_text(owner, "url", value)
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(
                "url", preview_of(value), "a URL without lone surrogates", owner=owner
            ) from None


def optional_positive_int(owner: str, name: str, value: object) -> None:
    _OPTIONAL_POSITIVE.check(value, name, owner)


_OPTIONAL_POSITIVE = optional(integer(minimum=1), allowed="None or an integer > 0")


# ---------------------------------------------------------------------------------------
# image headers


def _png_size(raw: bytes) -> tuple[int, int] | None:
    if raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR" and len(raw) >= 24:
        width, height = struct.unpack(">II", raw[16:24])
        return int(width), int(height)
    return None


def _gif_size(raw: bytes) -> tuple[int, int] | None:
    if raw[:6] in (b"GIF87a", b"GIF89a") and len(raw) >= 10:
        width, height = struct.unpack("<HH", raw[6:10])
        return int(width), int(height)
    return None


def _webp_size(raw: bytes) -> tuple[int, int] | None:
    if raw[:4] != b"RIFF" or raw[8:12] != b"WEBP" or len(raw) < 30:
        return None
    chunk = raw[12:16]
    if chunk == b"VP8 ":  # lossy: frame tag (3 bytes), start code, 14-bit sizes
        if raw[23:26] != b"\x9d\x01\x2a":
            return None
        width, height = struct.unpack("<HH", raw[26:30])
        return int(width & 0x3FFF), int(height & 0x3FFF)
    if chunk == b"VP8L":  # lossless: signature 0x2f, then 14-bit width-1, height-1
        if raw[20] != 0x2F:
            return None
        bits = int.from_bytes(raw[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":  # extended: 24-bit canvas width-1, height-1
        width = int.from_bytes(raw[24:27], "little") + 1
        height = int.from_bytes(raw[27:30], "little") + 1
        return width, height
    return None


# SOF markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) are not frames
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(raw: bytes) -> tuple[int, int] | None:
    if raw[:2] != b"\xff\xd8":
        return None
    at, n = 2, len(raw)
    while at + 4 <= n:
        if raw[at] != 0xFF:
            return None
        marker = raw[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, 0xD0, 0xD1, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6, 0xD7):  # no length
            at += 2
            continue
        (length,) = struct.unpack(">H", raw[at + 2 : at + 4])
        if marker in _SOF:
            if at + 9 > n:
                return None
            height, width = struct.unpack(">HH", raw[at + 5 : at + 9])
            return int(width), int(height)
        if marker == 0xDA or length < 2:  # start of scan before any frame: malformed
            return None
        at += 2 + length
    return None


_SNIFFERS = (
    ("image/png", _png_size),
    ("image/jpeg", _jpeg_size),
    ("image/gif", _gif_size),
    ("image/webp", _webp_size),
)


def image_size(raw: bytes) -> tuple[str, int, int] | None:
    """``(media_type, width, height)`` read from an image's header, or None if the bytes
    are not a PNG, JPEG, GIF or WebP image this parser understands. No pixel is decoded."""
    for media_type, sniff in _SNIFFERS:
        size = sniff(raw)
        if size is not None:
            return media_type, size[0], size[1]
    return None


# ---------------------------------------------------------------------------------------
# PDF pages

_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")
_PDF_COUNT = re.compile(
    rb"/Type\s*/Pages\b[^>]*?/Count\s+(\d+)|/Count\s+(\d+)[^>]*?/Type\s*/Pages\b"
)


def pdf_pages(raw: bytes) -> int | None:
    """Pages of a PDF: the page tree's /Count when readable, else the /Type /Page objects
    in the clear; None when both are hidden (compressed object streams)."""
    counts = [int(a or b) for a, b in _PDF_COUNT.findall(raw)]
    if counts:
        return max(counts) or None
    pages = len(_PDF_PAGE.findall(raw))
    return pages or None
