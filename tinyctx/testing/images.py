"""Small images and documents built in memory, for tests and strategies.

:func:`png` writes a complete, decodable PNG (solid colour, any size); :func:`jpeg`,
:func:`gif` and :func:`webp` write files whose headers say the requested size (what
tinyctx reads: it never decodes pixels) and that common decoders accept as structure.
:func:`pdf` writes a small PDF with a real page tree.
"""

from __future__ import annotations

import struct
import zlib

from ..parts import DocumentPart, ImagePart

__all__ = ["png", "jpeg", "gif", "webp", "pdf", "image_bytes", "image_part", "pdf_part"]


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(width: int, height: int, rgb: tuple[int, int, int] = (200, 200, 200)) -> bytes:
    """A valid solid-colour RGB PNG of ``width`` × ``height`` pixels."""
    row = b"\x00" + bytes(rgb) * width
    pixels = zlib.compress(row * height, 9)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", pixels)
        + _chunk(b"IEND", b"")
    )


def jpeg(width: int, height: int) -> bytes:
    """A baseline JPEG header (SOI, JFIF APP0, a comment, SOF0 with the size) and EOI."""
    app0 = b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    comment = b"tinyctx test image"
    sof = struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x11\x00\x02\x11\x01\x03\x11\x01"
    return (
        b"\xff\xd8"
        + b"\xff\xe0"
        + struct.pack(">H", len(app0) + 2)
        + app0
        + b"\xff\xfe"
        + struct.pack(">H", len(comment) + 2)
        + comment
        + b"\xff\xc0"
        + struct.pack(">H", len(sof) + 2)
        + sof
        + b"\xff\xd9"
    )


def gif(width: int, height: int) -> bytes:
    """A GIF89a with a two-colour palette and one image descriptor of the given size."""
    screen = struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    image = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0)
    data = b"\x02\x02\x44\x01\x00"  # LZW min code size 2, one block: clear, 0, end
    return b"GIF89a" + screen + image + data + b"\x3b"


def webp(width: int, height: int) -> bytes:
    """An extended-format (VP8X) WebP header with the given canvas size."""
    body = b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little")
    body += (height - 1).to_bytes(3, "little")
    chunk = b"VP8X" + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


_BUILDERS = {"image/png": png, "image/jpeg": jpeg, "image/gif": gif, "image/webp": webp}


def image_bytes(media_type: str, width: int, height: int) -> bytes:
    """An image file of ``media_type`` (png, jpeg, gif or webp) and size."""
    return _BUILDERS[media_type](width, height)


def image_part(
    width: int = 64, height: int = 48, media_type: str = "image/png", *, label: str = ""
) -> ImagePart:
    """An :class:`ImagePart` holding a built image of the given size and type."""
    return ImagePart.from_bytes(image_bytes(media_type, width, height), label=label)


def pdf(pages: int = 1, text: str = "tinyctx") -> bytes:
    """A small PDF with ``pages`` pages, each showing ``text``."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(pages))
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>")
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET"
    for i in range(pages):
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R >>"
        )
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010d} 00000 n \n" for o in offsets).encode()
    out += (
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    return out


def pdf_part(pages: int = 1, *, title: str = "doc.pdf") -> DocumentPart:
    """A :class:`DocumentPart` holding a built PDF of ``pages`` pages."""
    return DocumentPart.from_bytes(pdf(pages), "application/pdf", title=title)
