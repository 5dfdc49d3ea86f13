"""What images and documents cost in tokens, by the providers' published formulas.

**Anthropic** (Claude vision docs): an image whose long edge exceeds 1568 px, or that
would cost more than about 1,600 tokens, is first scaled down (aspect ratio kept); it then
costs ``ceil(width × height / 750)`` tokens. The pixel ceiling used here is 1568 × 784 =
1,229,312 px (the largest size in Anthropic's table of sizes that are *not* resized, so
every size in that table keeps its size; about 1.2 megapixels, ~1,640 tokens).

**OpenAI** (GPT-4o / GPT-4.1 family vision docs): ``detail="low"`` costs a flat 85 tokens.
``"high"`` (and ``"auto"`` or none, counted as high: the estimate must not undercount) fits
the image in 2048 × 2048, then scales it so its shortest side is at most 768 px, and costs
170 tokens per 512-px tile plus 85.

An image whose size is unknown (a URL without ``width``/``height``) counts as the most one
image can cost: 1,640 tokens for Anthropic, 1,445 for OpenAI high detail (768 × 2048,
eight tiles).

**Documents** (estimates, documented): a text/plain document costs its text's tokens
under the counter that measures it. A PDF costs :data:`PDF_PAGE_TOKENS` per page
(Anthropic turns each page into an image plus its extracted text, 1,500-3,000 tokens a page
by its docs; the upper end, so a guard does not undercount); when the page count cannot
be read, one page per :data:`PDF_BYTES_PER_PAGE` bytes of file, at least one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final, Literal

from .parts import Content, DocumentPart, ImagePart, TextPart

__all__ = [
    "ImageFormula",
    "IMAGE_FORMULAS",
    "ANTHROPIC_MAX_EDGE",
    "ANTHROPIC_MAX_PIXELS",
    "PDF_PAGE_TOKENS",
    "PDF_BYTES_PER_PAGE",
    "anthropic_image_size",
    "anthropic_image_tokens",
    "openai_image_size",
    "openai_image_tokens",
    "image_tokens",
    "document_tokens",
    "media_tokens",
]

ImageFormula = Literal["anthropic", "openai"]
IMAGE_FORMULAS: Final[tuple[str, ...]] = ("anthropic", "openai")

ANTHROPIC_MAX_EDGE: Final = 1568
ANTHROPIC_MAX_PIXELS: Final = 1568 * 784
ANTHROPIC_PIXELS_PER_TOKEN: Final = 750

OPENAI_LOW: Final = 85
OPENAI_BASE: Final = 85
OPENAI_PER_TILE: Final = 170
OPENAI_TILE: Final = 512
OPENAI_FIT: Final = 2048
OPENAI_SHORT_SIDE: Final = 768

PDF_PAGE_TOKENS: Final = 3000
PDF_BYTES_PER_PAGE: Final = 100_000


def anthropic_image_size(width: int, height: int) -> tuple[int, int]:
    """The size Anthropic's API scales an image to before counting it."""
    scale = min(
        1.0,
        ANTHROPIC_MAX_EDGE / max(width, height),
        math.sqrt(ANTHROPIC_MAX_PIXELS / (width * height)),
    )
    if scale >= 1.0:
        return width, height
    return max(1, int(width * scale)), max(1, int(height * scale))


def anthropic_image_tokens(width: int, height: int) -> int:
    """``ceil(w × h / 750)`` after Anthropic's resize limits."""
    w, h = anthropic_image_size(width, height)
    return math.ceil(w * h / ANTHROPIC_PIXELS_PER_TOKEN)


def openai_image_size(width: int, height: int) -> tuple[int, int]:
    """The size OpenAI's high-detail mode tiles: fit in 2048², shortest side ≤ 768."""
    w, h = float(width), float(height)
    if max(w, h) > OPENAI_FIT:
        scale = OPENAI_FIT / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > OPENAI_SHORT_SIDE:
        scale = OPENAI_SHORT_SIDE / min(w, h)
        w, h = w * scale, h * scale
    return max(1, round(w)), max(1, round(h))


def openai_image_tokens(width: int, height: int, detail: str | None = None) -> int:
    """85 for low detail; else 170 per 512-px tile of the scaled image, plus 85."""
    if detail == "low":
        return OPENAI_LOW
    w, h = openai_image_size(width, height)
    tiles = math.ceil(w / OPENAI_TILE) * math.ceil(h / OPENAI_TILE)
    return OPENAI_PER_TILE * tiles + OPENAI_BASE


_UNKNOWN_ANTHROPIC: Final = math.ceil(ANTHROPIC_MAX_PIXELS / ANTHROPIC_PIXELS_PER_TOKEN)
_UNKNOWN_OPENAI: Final = openai_image_tokens(OPENAI_SHORT_SIDE, OPENAI_FIT)


def image_tokens(part: ImagePart, formula: ImageFormula = "anthropic") -> int:
    """Tokens of one image under ``formula`` (its size from the header, or the maximum)."""
    size = part.size
    if formula == "openai":
        if part.detail == "low":
            return OPENAI_LOW
        return _UNKNOWN_OPENAI if size is None else openai_image_tokens(*size, part.detail)
    return _UNKNOWN_ANTHROPIC if size is None else anthropic_image_tokens(*size)


def document_tokens(part: DocumentPart, count_text: Callable[[str], int]) -> int:
    """Tokens of one document: a text file's text, a PDF's pages (see the module doc)."""
    text = part.text
    if text is not None:
        return count_text(text)
    pages = part.pages
    if pages is None:
        size = len(part.data) * 3 // 4 if part.data is not None else 0
        pages = max(1, math.ceil(size / PDF_BYTES_PER_PAGE))
    return pages * PDF_PAGE_TOKENS


def media_tokens(
    content: Content, count_text: Callable[[str], int], formula: ImageFormula = "anthropic"
) -> int:
    """Tokens of the images and documents in ``content`` (0 for a str)."""
    if isinstance(content, str):
        return 0
    total = 0
    for part in content:
        if isinstance(part, TextPart):
            continue
        if isinstance(part, ImagePart):
            total += image_tokens(part, formula)
        else:
            total += document_tokens(part, count_text)
    return total
