"""Content parts: text, images and documents inside a message.

A message's ``content`` is a ``str`` (the fast path, unchanged) or a non-empty tuple of
frozen parts — :class:`TextPart`, :class:`ImagePart`, :class:`DocumentPart` — in user
messages and tool results alike. ``message.text`` is the text of its text parts (what code
that read ``.content`` as a string wants); :func:`describe_content` names the media too,
for anything that must turn a message into plain text (summaries, notes, placeholders)
without dropping an image or copying its base64.

Parts validate at construction: base64 must decode (strictly), the media type must be
one of the allowed ones and match the bytes, and no part is empty. An image's pixel size
and a PDF's page count are read from the bytes once, at construction, without decoding
pixels. A part's equality and hash go by a digest of its bytes computed then, so
comparing or hashing a message never touches megabytes twice; ``evolve`` of a message
shares the same part objects (nothing is copied).

Each part has a canonical JSON form (:meth:`TextPart.to_json` etc. and
:func:`part_from_json`) that the codec and the formats build on.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

from attrs import field, frozen

from .errors import ConfigError
from .media_bytes import (
    checked_url,
    decode_base64,
    digest_of,
    image_size,
    optional_positive_int,
    optional_text,
    pdf_pages,
    preview_of,
)

__all__ = [
    "TextPart",
    "ImagePart",
    "DocumentPart",
    "Part",
    "PART_TYPES",
    "Content",
    "IMAGE_MEDIA_TYPES",
    "DOCUMENT_MEDIA_TYPES",
    "IMAGE_DETAILS",
    "image_size",
    "content_text",
    "content_bytes",
    "content_parts",
    "describe_content",
    "describe_part",
    "media_parts",
    "has_media",
    "to_content",
    "part_from_json",
]

IMAGE_MEDIA_TYPES: tuple[str, ...] = ("image/png", "image/jpeg", "image/gif", "image/webp")
DOCUMENT_MEDIA_TYPES: tuple[str, ...] = ("application/pdf", "text/plain")
IMAGE_DETAILS: tuple[str, ...] = ("auto", "low", "high")

Detail = Literal["auto", "low", "high"]


# ---------------------------------------------------------------------------------------
# parts


@frozen(cache_hash=True)
class TextPart:
    """A run of text inside a message's content."""

    text: str = field()
    kind: ClassVar[str] = "text"

    @text.validator
    def _check(self, attribute: Any, value: Any) -> None:
        if not isinstance(value, str) or not value:
            raise ConfigError("text", value, "a non-empty string", owner="TextPart")

    def to_json(self) -> dict[str, Any]:
        """The part's canonical JSON object."""
        return {"type": "text", "text": self.text}


class _Binary:
    """What images and documents share: equality and hash by digest, sizes, data URLs."""

    __slots__ = ()
    if TYPE_CHECKING:
        data: str | None
        url: str | None
        media_type: str | None
        digest: str

    def _key(self) -> tuple[object, ...]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def data_url(self) -> str:
        """A ``data:`` URL for base64 content, else the URL itself."""
        if self.data is None:
            return str(self.url)
        return f"data:{self.media_type};base64,{self.data}"

    @property
    def nbytes(self) -> int:
        """Bytes this part takes in a request (its base64 or URL characters)."""
        return len(self.data) if self.data is not None else len(str(self.url))

    def _source_json(self, kind: str) -> dict[str, Any]:
        out: dict[str, Any] = {"type": kind}
        if self.data is not None:
            out["data"] = self.data
        else:
            out["url"] = self.url
        if self.media_type is not None:
            out["media_type"] = self.media_type
        return out


@frozen(eq=False)
class ImagePart(_Binary):
    """An image: base64 ``data`` with its ``media_type``, or a ``url``; optional ``detail``
    (OpenAI's "auto" / "low" / "high") and a short ``label`` ("screenshot") used when the
    image is described or cleared.

    For base64 data the pixel size is read from the header (``width``, ``height``) and
    the media type may be omitted (it is sniffed); a given media type must match the
    bytes. For a URL, ``width``/``height`` may be given when known (token estimates use
    them; unknown sizes are estimated at the provider's largest image).

    Args:
        data: The image's bytes, base64 (or None with a ``url``).
        media_type: Its media type (sniffed from ``data`` when None).
        url: Where the image is, instead of ``data``.
        detail: OpenAI's ``"auto"``, ``"low"`` or ``"high"``, or None.
        label: A short name used when the image is described or cleared.
        width: The width in pixels (read from ``data``; may be given for a URL).
        height: The height in pixels (likewise).
    """

    data: str | None = None
    media_type: str | None = None
    url: str | None = field(default=None, kw_only=True)
    detail: Detail | None = field(default=None, kw_only=True)
    label: str = field(default="", kw_only=True)
    width: int | None = field(default=None, kw_only=True)
    height: int | None = field(default=None, kw_only=True)
    digest: str = field(init=False, repr=False)
    """A digest of the image bytes (or of the URL): what equality and hashing use."""
    kind: ClassVar[str] = "image"

    def __attrs_post_init__(self) -> None:
        owner = "ImagePart"
        if (self.data is None) == (self.url is None):
            raise ConfigError(
                "data/url", "both" if self.data else "neither", "exactly one of them", owner=owner
            )
        optional_text(owner, "media_type", self.media_type)
        if self.detail is not None and self.detail not in IMAGE_DETAILS:
            raise ConfigError("detail", self.detail, f"None or one of {IMAGE_DETAILS}", owner=owner)
        if not isinstance(self.label, str):
            raise ConfigError("label", self.label, "a string", owner=owner)
        optional_positive_int(owner, "width", self.width)
        optional_positive_int(owner, "height", self.height)
        if (self.width is None) != (self.height is None):
            raise ConfigError(
                "width/height", (self.width, self.height), "both or neither", owner=owner
            )
        if self.media_type is not None and self.media_type not in IMAGE_MEDIA_TYPES:
            raise ConfigError(
                "media_type", self.media_type, f"one of {IMAGE_MEDIA_TYPES}", owner=owner
            )
        if self.data is None:
            checked_url(owner, self.url)
            object.__setattr__(self, "digest", "url:" + digest_of(str(self.url).encode()))
            return
        raw = decode_base64(owner, self.data)
        sniffed = image_size(raw)
        if sniffed is None:
            raise ConfigError(
                "data",
                preview_of(self.data),
                f"a PNG, JPEG, GIF or WebP image with a readable header ({IMAGE_MEDIA_TYPES})",
                owner=owner,
            )
        media_type, width, height = sniffed
        if self.media_type is not None and self.media_type != media_type:
            raise ConfigError(
                "media_type",
                self.media_type,
                f"{media_type!r}, the format of the data",
                owner=owner,
            )
        if self.width is not None and (self.width, self.height) != (width, height):
            raise ConfigError(
                "width/height",
                (self.width, self.height),
                f"None or the header's size {(width, height)}",
                owner=owner,
            )
        object.__setattr__(self, "media_type", media_type)
        object.__setattr__(self, "width", width)
        object.__setattr__(self, "height", height)
        object.__setattr__(self, "digest", digest_of(raw))

    # identity of content, not of megabytes
    def _key(self) -> tuple[object, ...]:
        return ("image", self.digest, self.media_type, self.detail, self.label, self.width)

    @classmethod
    def from_bytes(
        cls,
        raw: bytes,
        media_type: str | None = None,
        *,
        detail: Detail | None = None,
        label: str = "",
    ) -> ImagePart:
        """An image from its file bytes (the media type is sniffed when not given).

        Args:
            raw: The image file's bytes.
            media_type: Its media type, or None to sniff it.
            detail: OpenAI's ``"auto"``, ``"low"`` or ``"high"``, or None.
            label: A short name used when the image is described or cleared.
        """
        return cls(base64.b64encode(raw).decode("ascii"), media_type, detail=detail, label=label)

    @classmethod
    def from_data_url(cls, url: str, *, detail: Detail | None = None, label: str = "") -> ImagePart:
        """An image from a ``data:<media type>;base64,<data>`` URL; any other URL stays a URL."""
        media_type, data = _split_data_url(url, "ImagePart")
        if data is None:
            return cls(url=url, detail=detail, label=label)
        return cls(data, media_type, detail=detail, label=label)

    @property
    def size(self) -> tuple[int, int] | None:
        """``(width, height)`` in pixels, when known."""
        if self.width is None or self.height is None:
            return None
        return self.width, self.height

    def to_json(self) -> dict[str, Any]:
        """The part's canonical JSON object (derived sizes only for URLs)."""
        out = self._source_json("image")
        if self.data is None and self.width is not None:
            out["width"], out["height"] = self.width, self.height
        if self.detail is not None:
            out["detail"] = self.detail
        if self.label:
            out["label"] = self.label
        return out


@frozen(eq=False)
class DocumentPart(_Binary):
    """A document: a PDF or a plain-text file, as base64 ``data`` with its ``media_type``
    ("application/pdf" or "text/plain"), or a ``url``; an optional ``title`` (file name).

    A PDF's page count is read from its page tree when it is in the clear; ``pages`` may
    be given for a URL or a PDF whose pages cannot be read.

    Args:
        data: The document's bytes, base64 (or None with a ``url``).
        media_type: ``"application/pdf"`` or ``"text/plain"``.
        url: Where the document is, instead of ``data``.
        title: Its file name, or "".
        pages: Its page count, when the bytes do not say it.
    """

    data: str | None = None
    media_type: str | None = None
    url: str | None = field(default=None, kw_only=True)
    title: str = field(default="", kw_only=True)
    pages: int | None = field(default=None, kw_only=True)
    digest: str = field(init=False, repr=False)
    kind: ClassVar[str] = "document"

    def __attrs_post_init__(self) -> None:
        owner = "DocumentPart"
        if (self.data is None) == (self.url is None):
            raise ConfigError(
                "data/url", "both" if self.data else "neither", "exactly one of them", owner=owner
            )
        if not isinstance(self.title, str):
            raise ConfigError("title", self.title, "a string", owner=owner)
        optional_positive_int(owner, "pages", self.pages)
        if self.media_type is not None and self.media_type not in DOCUMENT_MEDIA_TYPES:
            raise ConfigError(
                "media_type", self.media_type, f"one of {DOCUMENT_MEDIA_TYPES}", owner=owner
            )
        if self.data is None:
            checked_url(owner, self.url)
            object.__setattr__(self, "digest", "url:" + digest_of(str(self.url).encode()))
            return
        if self.media_type is None:
            raise ConfigError("media_type", None, f"one of {DOCUMENT_MEDIA_TYPES}", owner=owner)
        raw = decode_base64(owner, self.data)
        if self.media_type == "application/pdf":
            if not raw.startswith(b"%PDF-"):
                raise ConfigError(
                    "data", preview_of(self.data), "a PDF file (starting with %PDF-)", owner=owner
                )
            if self.pages is None:
                object.__setattr__(self, "pages", pdf_pages(raw))
        else:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    "data", preview_of(self.data), f"UTF-8 text for text/plain: {exc}", owner=owner
                ) from None
        object.__setattr__(self, "digest", digest_of(raw))

    def _key(self) -> tuple[object, ...]:
        return ("document", self.digest, self.media_type, self.title, self.pages)

    @classmethod
    def from_bytes(cls, raw: bytes, media_type: str, *, title: str = "") -> DocumentPart:
        """A document from its file bytes."""
        return cls(base64.b64encode(raw).decode("ascii"), media_type, title=title)

    @classmethod
    def from_text(cls, text: str, *, title: str = "") -> DocumentPart:
        """A plain-text document."""
        return cls.from_bytes(text.encode("utf-8"), "text/plain", title=title)

    @classmethod
    def from_data_url(cls, url: str, *, title: str = "") -> DocumentPart:
        """A document from a ``data:<media type>;base64,<data>`` URL; any other URL stays."""
        media_type, data = _split_data_url(url, "DocumentPart")
        if data is None:
            return cls(url=url, title=title)
        return cls(data, media_type, title=title)

    @property
    def text(self) -> str | None:
        """The text of a text/plain document (decoded on each call), else None."""
        if self.media_type != "text/plain" or self.data is None:
            return None
        return base64.b64decode(self.data).decode("utf-8")

    def to_json(self) -> dict[str, Any]:
        """The part's canonical JSON object (a PDF's read page count is not written)."""
        out = self._source_json("document")
        if self.data is None and self.pages is not None:
            out["pages"] = self.pages
        if self.title:
            out["title"] = self.title
        return out


Part: TypeAlias = TextPart | ImagePart | DocumentPart
Content: TypeAlias = str | tuple[Part, ...]
PART_TYPES = (TextPart, ImagePart, DocumentPart)
"""The part classes, for ``isinstance`` checks."""

_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)?(?:;[\w=.+-]+)*?;base64,", re.ASCII)


def _split_data_url(url: str, owner: str) -> tuple[str | None, str | None]:
    """``(media_type, base64)`` of a data URL; ``(None, None)`` for any other URL."""
    if not isinstance(url, str) or not url:
        raise ConfigError("url", url, "a non-empty string", owner=owner)
    if not url.startswith("data:"):
        return None, None
    match = _DATA_URL.match(url)
    if match is None:
        raise ConfigError(
            "url",
            preview_of(url),
            "a base64 data URL 'data:<media type>;base64,<data>'",
            owner=owner,
        )
    return match.group(1), url[match.end() :]


def part_from_json(value: Mapping[str, Any], *, path: str = "part") -> Part:
    """The part a :meth:`to_json` object describes; a malformed one is a ConfigError
    naming ``path`` and the allowed types."""
    if not isinstance(value, Mapping):
        raise ConfigError(path, type(value).__name__, "a JSON object")
    kind = value.get("type")
    fields = {k: v for k, v in value.items() if k != "type"}
    cls: type[Part]
    if kind == "text":
        cls = TextPart
    elif kind == "image":
        cls = ImagePart
    elif kind == "document":
        cls = DocumentPart
    else:
        raise ConfigError(f"{path}.type", kind, "'text', 'image' or 'document'")
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ConfigError(path, sorted(fields), f"the fields of {cls.__name__}: {exc}") from None


# ---------------------------------------------------------------------------------------
# content helpers


def to_content(value: object, *, owner: str = "Message") -> Content:
    """Validate and normalize a message's content: a ``str`` as is, an iterable of parts
    as a non-empty tuple (a bare part becomes a one-part tuple). A value of the wrong type
    is a TypeError (as for any attrs field); an empty sequence a ConfigError."""
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, PART_TYPES):
        return (value,)
    if isinstance(value, Iterable) and not isinstance(value, (bytes, bytearray, Mapping)):
        parts = value if type(value) is tuple else tuple(value)
        if not parts:
            raise ConfigError(
                "content", (), "a str or a non-empty sequence of parts ('' for none)", owner=owner
            )
        for index, part in enumerate(parts):
            if not isinstance(part, PART_TYPES):
                raise TypeError(
                    f"{owner}.content[{index}] must be a TextPart, ImagePart or DocumentPart, "
                    f"got {type(part).__name__}"
                )
        return parts
    raise TypeError(
        f"{owner}.content must be a str or a sequence of TextPart, ImagePart, DocumentPart, "
        f"got {type(value).__name__}"
    )


def content_parts(content: Content) -> tuple[Part, ...]:
    """Content as parts: a str is one text part (none when empty)."""
    if isinstance(content, str):
        return (TextPart(content),) if content else ()
    return content


def content_text(content: Content) -> str:
    """The text of ``content``: the str itself, or its text parts joined by newlines.
    Media are not included (see :func:`describe_content`)."""
    if isinstance(content, str):
        return content
    texts = [p.text for p in content if isinstance(p, TextPart)]
    return texts[0] if len(texts) == 1 else "\n".join(texts)


def media_parts(content: Content) -> tuple[ImagePart | DocumentPart, ...]:
    """The image and document parts of ``content`` (none for a str)."""
    if isinstance(content, str):
        return ()
    return tuple(p for p in content if not isinstance(p, TextPart))


def has_media(content: Content) -> bool:
    """True when ``content`` holds an image or a document."""
    return type(content) is not str and any(type(p) is not TextPart for p in content)


def content_bytes(content: Content) -> int:
    """What ``content`` weighs in a request: UTF-8 bytes of its text plus the base64 (or
    URL) characters of each image and document."""
    if isinstance(content, str):
        return len(content) if content.isascii() else len(content.encode("utf-8", "surrogatepass"))
    total = 0
    for part in content:
        total += content_bytes(part.text) if isinstance(part, TextPart) else part.nbytes
    return total


def _source(url: str) -> str:
    """Where a part comes from, as a description names it: the URL whole (a signed URL cut
    short could not be fetched again), a ``data:`` URL only by its start (never base64)."""
    return preview_of(url, 80) if url.startswith("data:") else url


def describe_part(part: Part) -> str:
    """A short text naming a part: the text itself, or ``[image: screenshot image/png
    1280×800]`` / ``[document: report.pdf application/pdf, 12 pages]`` — never base64. A
    part from a URL names it whole (``[image: from https://...]``)."""
    if isinstance(part, TextPart):
        return part.text
    words = []
    if isinstance(part, ImagePart):
        if part.label:
            words.append(part.label)
        if part.media_type:
            words.append(part.media_type)
        if part.width is not None:
            words.append(f"{part.width}×{part.height}")
        if part.data is None:
            words.append(f"from {_source(str(part.url))}")
        return f"[image: {' '.join(words)}]" if words else "[image]"
    if part.title:
        words.append(part.title)
    if part.media_type:
        words.append(part.media_type)
    text = " ".join(words)
    if part.pages is not None:
        text += f", {part.pages} page{'s' if part.pages != 1 else ''}"
    if part.data is None:
        text += f" from {_source(str(part.url))}"
    return f"[document: {text.strip(' ,')}]" if text.strip() else "[document]"


def describe_content(content: Content) -> str:
    """``content`` as plain text with each image or document named by
    :func:`describe_part`: what a summarizer or a note extractor may read."""
    if isinstance(content, str):
        return content
    return "\n".join(describe_part(p) for p in content)
