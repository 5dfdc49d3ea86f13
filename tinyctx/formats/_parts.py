"""Content parts in the OpenAI and Anthropic wire shapes, both ways.

OpenAI chat completions: ``{"type": "text", "text"}``, ``{"type": "image_url",
"image_url": {"url", "detail"?}}`` (a data URL for base64 images) and ``{"type": "file",
"file": {"file_data": <data URL>, "filename"?}}``. Anthropic: ``{"type": "text"}``,
``{"type": "image", "source": {"type": "base64", "media_type", "data"} | {"type": "url",
"url"}}`` and ``{"type": "document", "source": {"type": "base64" | "text" | "url", ...},
"title"?}``.

What a format has no field for (an image's ``label``, a URL image's size, Anthropic's
missing ``detail``, a URL document's page count) rides in a ``"tinyctx"`` key of the part
in file mode, so files are lossless; API mode leaves it out. A part a format cannot
express at all (a document by URL for OpenAI) is a :class:`FormatError` naming the index.

Reading: a content list of text parts only is the text, joined (as before parts
existed); a list holding any image or document is a tuple of parts, empty text parts left
out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..errors import ConfigError
from ..parts import Content, DocumentPart, ImagePart, Part, TextPart
from ._common import EXTENSION_KEY, FormatError, expect_mapping

T = TypeVar("T")

__all__ = [
    "openai_part",
    "openai_content",
    "read_openai_part",
    "anthropic_part",
    "anthropic_content",
    "read_anthropic_part",
    "read_parts",
]


def _extension(part: ImagePart | DocumentPart, *, detail: bool) -> dict[str, Any]:
    """What the native shapes cannot say about ``part`` (``detail``: nor its detail)."""
    ext: dict[str, Any] = {}
    if isinstance(part, ImagePart):
        if detail and part.detail is not None:
            ext["detail"] = part.detail
        if part.label:
            ext["label"] = part.label
        if part.data is None and part.width is not None:
            ext["width"], ext["height"] = part.width, part.height
        if part.data is None and part.media_type is not None:
            ext["media_type"] = part.media_type
    elif part.data is None:
        if part.pages is not None:
            ext["pages"] = part.pages
        if part.media_type is not None:
            ext["media_type"] = part.media_type
    return ext


_EXT_KEYS = {
    "label": str,
    "width": int,
    "height": int,
    "media_type": str,
    "pages": int,
    "detail": str,
}


def _read_extension(block: Mapping[str, Any], fmt: str, index: int | None) -> dict[str, Any]:
    value = block.get(EXTENSION_KEY)
    if value is None:
        return {}
    ext = expect_mapping(value, f"a part's {EXTENSION_KEY!r} key", fmt=fmt, index=index)
    for key, item in ext.items():
        kind = _EXT_KEYS.get(key)
        if kind is None or not isinstance(item, kind):
            raise FormatError(
                f"unknown or malformed key {key!r} in a part's {EXTENSION_KEY!r} (allowed: "
                f"{', '.join(sorted(_EXT_KEYS))})",
                format=fmt,
                index=index,
            )
    return dict(ext)


def _with_extension(
    block: dict[str, Any], part: Part, for_api: bool, *, detail: bool = False
) -> dict[str, Any]:
    if not for_api and not isinstance(part, TextPart):
        ext = _extension(part, detail=detail)
        if ext:
            block[EXTENSION_KEY] = ext
    return block


def _build(fmt: str, index: int | None, make: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``make(...)``; a part refusing its fields is a FormatError naming the index."""
    try:
        return make(*args, **kwargs)
    except (ConfigError, TypeError) as exc:
        raise FormatError(str(exc), format=fmt, index=index) from None


# ---------------------------------------------------------------------------------------
# OpenAI


def openai_part(part: Part, *, index: int, for_api: bool, fmt: str = "openai") -> dict[str, Any]:
    """One part as an OpenAI chat-completions content part."""
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        image: dict[str, Any] = {"url": part.data_url}
        if part.detail is not None:
            image["detail"] = part.detail
        return _with_extension({"type": "image_url", "image_url": image}, part, for_api)
    if part.data is None:
        raise FormatError(
            "cannot express a document given by URL: OpenAI chat completions take files as "
            "base64 data (file_data) or an uploaded file_id; fetch it into a DocumentPart",
            format=fmt,
            index=index,
        )
    file: dict[str, Any] = {"file_data": part.data_url}
    if part.title:
        file["filename"] = part.title
    return _with_extension({"type": "file", "file": file}, part, for_api)


def openai_content(
    content: Content, *, index: int, for_api: bool, fmt: str = "openai"
) -> str | list[dict[str, Any]]:
    """A message content in OpenAI's shape: the str, or a list of content parts."""
    if isinstance(content, str):
        return content
    return [openai_part(p, index=index, for_api=for_api, fmt=fmt) for p in content]


def read_openai_part(
    block: Mapping[str, Any], kind: str, *, fmt: str, index: int | None, position: int
) -> Part | None:
    """The part an OpenAI image_url or file content part says (None: not a media part)."""
    ext = _read_extension(block, fmt, index)
    if kind == "image_url":
        image = block.get("image_url")
        if isinstance(image, str):  # some clients write the URL directly
            image = {"url": image}
        image_map = expect_mapping(
            image, f"content part {position}.image_url", fmt=fmt, index=index
        )
        url = image_map.get("url")
        if not isinstance(url, str) or not url:
            raise FormatError(
                f"content part {position} image_url has no url", format=fmt, index=index
            )
        detail = image_map.get("detail")
        return _image(url, detail, ext, fmt=fmt, index=index)
    if kind == "file":
        file = expect_mapping(
            block.get("file"), f"content part {position}.file", fmt=fmt, index=index
        )
        data = file.get("file_data")
        if not isinstance(data, str) or not data:
            raise FormatError(
                f"content part {position}: only files given as file_data can be held "
                "(an uploaded file_id is not in the message)",
                format=fmt,
                index=index,
            )
        title = file.get("filename", "")
        if data.startswith("data:"):
            return _build(fmt, index, DocumentPart.from_data_url, data, title=title or "")
        return _build(fmt, index, DocumentPart, data, ext.get("media_type"), title=title or "")
    return None


def _image(
    url: str, detail: object, ext: Mapping[str, Any], *, fmt: str, index: int | None
) -> ImagePart:
    label = ext.get("label", "")
    if url.startswith("data:"):
        return _build(fmt, index, ImagePart.from_data_url, url, detail=detail, label=label)
    return _build(
        fmt,
        index,
        ImagePart,
        url=url,
        detail=detail,
        label=label,
        width=ext.get("width"),
        height=ext.get("height"),
        media_type=ext.get("media_type"),
    )


# ---------------------------------------------------------------------------------------
# Anthropic


def anthropic_part(part: Part, *, for_api: bool) -> dict[str, Any]:
    """One part as an Anthropic content block (an image's detail is OpenAI's only)."""
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        if part.data is None:
            source: dict[str, Any] = {"type": "url", "url": part.url}
        else:
            source = {"type": "base64", "media_type": part.media_type, "data": part.data}
        return _with_extension({"type": "image", "source": source}, part, for_api, detail=True)
    if part.data is None:
        source = {"type": "url", "url": part.url}
    elif part.media_type == "text/plain":
        source = {"type": "text", "media_type": "text/plain", "data": part.text}
    else:
        source = {"type": "base64", "media_type": part.media_type, "data": part.data}
    block: dict[str, Any] = {"type": "document", "source": source}
    if part.title:
        block["title"] = part.title
    return _with_extension(block, part, for_api)


def anthropic_content(content: Content, *, for_api: bool) -> str | list[dict[str, Any]]:
    """A message content in Anthropic's shape: the str, or a list of blocks."""
    if isinstance(content, str):
        return content
    return [anthropic_part(p, for_api=for_api) for p in content]


def read_anthropic_part(
    block: Mapping[str, Any], kind: str, *, fmt: str, index: int | None, position: int
) -> Part | None:
    """The part an Anthropic image or document block says (None: not a media block)."""
    if kind not in ("image", "document"):
        return None
    ext = _read_extension(block, fmt, index)
    where = f"content block {position}.source"
    source = expect_mapping(block.get("source"), where, fmt=fmt, index=index)
    source_type = source.get("type")
    if kind == "image":
        if source_type == "base64":
            return _build(
                fmt,
                index,
                ImagePart,
                source.get("data"),
                source.get("media_type"),
                detail=ext.get("detail"),
                label=ext.get("label", ""),
            )
        if source_type == "url":
            url = source.get("url")
            if not isinstance(url, str) or not url:
                raise FormatError(f"{where} has no url", format=fmt, index=index)
            return _image(url, ext.get("detail"), ext, fmt=fmt, index=index)
        raise FormatError(
            f"{where}: cannot hold an image source of type {source_type!r} (allowed: "
            "'base64', 'url')",
            format=fmt,
            index=index,
        )
    title = block.get("title") or ""
    if source_type == "base64":
        return _build(
            fmt, index, DocumentPart, source.get("data"), source.get("media_type"), title=title
        )
    if source_type == "text":
        data = source.get("data")
        if not isinstance(data, str) or not data:
            raise FormatError(f"{where} has no text data", format=fmt, index=index)
        return _build(fmt, index, DocumentPart.from_text, data, title=title)
    if source_type == "url":
        return _build(
            fmt,
            index,
            DocumentPart,
            url=source.get("url"),
            title=title,
            pages=ext.get("pages"),
            media_type=ext.get("media_type"),
        )
    raise FormatError(
        f"{where}: cannot hold a document source of type {source_type!r} (allowed: "
        "'base64', 'text', 'url')",
        format=fmt,
        index=index,
    )


# ---------------------------------------------------------------------------------------
# reading a content list


def read_parts(texts_and_parts: Sequence[str | Part], joiner: str) -> Content:
    """Content from what a list said in order: the joined text when it holds no media,
    else a tuple of parts (empty texts left out)."""
    if all(isinstance(item, str) for item in texts_and_parts):
        return joiner.join(texts_and_parts)  # type: ignore[arg-type]
    parts = [
        TextPart(item) if isinstance(item, str) else item
        for item in texts_and_parts
        if not (isinstance(item, str) and not item)
    ]
    return tuple(parts)
