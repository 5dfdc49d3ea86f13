"""MCP content blocks as tinyctx content parts.

A tool result, a resource and a prompt message from an MCP server carry content blocks:
text, images, audio, resource links and embedded resources. Each becomes what tinyctx
already knows, so images are counted and cleared like any other and text stays the fast
``str`` path:

- text → :class:`~tinyctx.TextPart` (a result of text only becomes one ``str``);
- an image in a media type tinyctx takes (PNG, JPEG, GIF, WebP) →
  :class:`~tinyctx.ImagePart`; any other image, or one whose bytes do not read as its type,
  becomes a short text saying what was left out (never its base64);
- an embedded text resource → a text/plain :class:`~tinyctx.DocumentPart` titled with its
  URI; a PDF blob → a PDF DocumentPart; an image blob → an ImagePart labelled with its URI;
  any other blob → a short text naming it;
- audio and resource links → a short text naming them (the model cannot open either).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import mcp.types as mt

from ..errors import ConfigError
from ..parts import IMAGE_MEDIA_TYPES, DocumentPart, ImagePart, Part, TextPart

__all__ = ["content_to_parts", "parts_or_text", "resource_to_parts", "result_text"]


def _approx_bytes(data: str) -> int:
    return len(data) * 3 // 4


def _image(data: str, mime_type: str | None, label: str = "") -> Part:
    where = f" {label}" if label else ""
    if mime_type not in IMAGE_MEDIA_TYPES:
        return TextPart(
            f"[image{where} ({mime_type}, ~{_approx_bytes(data)} bytes) not shown: "
            f"only {', '.join(IMAGE_MEDIA_TYPES)} are passed on]"
        )
    try:
        return ImagePart(data, mime_type, label=label)
    except ConfigError as exc:
        return TextPart(f"[image{where} ({mime_type}) not shown: {exc}]")


def resource_to_parts(
    contents: mt.TextResourceContents | mt.BlobResourceContents,
) -> Part:
    """One resource's contents (embedded in a result, or read) as a part."""
    uri = str(contents.uri)
    mime = contents.mime_type
    if isinstance(contents, mt.TextResourceContents):
        if not contents.text:
            return TextPart(f"[resource {uri}: empty]")
        return DocumentPart.from_text(contents.text, title=uri)
    blob = contents.blob
    if mime is not None and mime.startswith("image/"):
        return _image(blob, mime, label=uri)
    if mime == "application/pdf":
        try:
            return DocumentPart(blob, "application/pdf", title=uri)
        except ConfigError as exc:
            return TextPart(f"[resource {uri} (application/pdf) not shown: {exc}]")
    return TextPart(f"[resource {uri} ({mime or 'no media type'}, ~{_approx_bytes(blob)} bytes)]")


def _block(block: Any) -> Part | None:
    if isinstance(block, mt.TextContent):
        return TextPart(block.text) if block.text else None
    if isinstance(block, mt.ImageContent):
        return _image(block.data, block.mime_type)
    if isinstance(block, mt.EmbeddedResource):
        return resource_to_parts(block.resource)
    if isinstance(block, mt.AudioContent):
        return TextPart(
            f"[audio ({block.mime_type}, ~{_approx_bytes(block.data)} bytes) not shown]"
        )
    if isinstance(block, mt.ResourceLink):
        name = f" ({block.name})" if block.name else ""
        return TextPart(f"[resource link: {block.uri}{name}]")
    return TextPart(f"[content of type {getattr(block, 'type', type(block).__name__)!r}]")


def content_to_parts(blocks: Iterable[Any]) -> tuple[Part, ...]:
    """MCP content blocks as parts, in order (empty text blocks are dropped)."""
    parts = []
    for block in blocks:
        part = _block(block)
        if part is not None:
            parts.append(part)
    return tuple(parts)


def parts_or_text(parts: Sequence[Part]) -> str | tuple[Part, ...]:
    """Text-only content as one string (the fast path), anything else as the parts."""
    texts = [p.text for p in parts if type(p) is TextPart]
    if len(texts) == len(parts):
        return "\n".join(texts)
    return tuple(parts)


def result_text(result: mt.CallToolResult) -> str | tuple[Part, ...]:
    """A tool result's content as a tool's output: its parts, or its structured content
    as JSON text when it sent no content blocks."""
    parts = content_to_parts(result.content)
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return parts_or_text(parts)
