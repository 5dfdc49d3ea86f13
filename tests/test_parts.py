"""Content parts: images and documents in user messages and tool results."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    ConfigError,
    DocumentPart,
    ImagePart,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.parts import (
    content_parts,
    describe_content,
    has_media,
    image_size,
    media_parts,
    part_from_json,
)
from tinyctx.testing.images import gif, image_bytes, image_part, jpeg, pdf, pdf_part, png, webp

MEDIA = ("image/png", "image/jpeg", "image/gif", "image/webp")


class TestImageHeaders:
    """Pixel sizes come from the header of each supported format, without decoding."""

    @given(
        st.sampled_from(MEDIA),
        st.integers(min_value=1, max_value=5000),
        st.integers(min_value=1, max_value=5000),
    )
    def test_every_format_reports_its_size(self, media_type: str, w: int, h: int) -> None:
        """A built PNG, JPEG, GIF or WebP of any size reads back its type and size."""
        assert image_size(image_bytes(media_type, w, h)) == (media_type, w, h)

    def test_jpeg_with_exif_before_the_frame(self) -> None:
        """Segments before the frame header (EXIF, comments) are skipped by length."""
        raw = jpeg(1280, 800)
        exif = b"\xff\xe1" + (2 + 3000).to_bytes(2, "big") + b"E" * 3000
        assert image_size(raw[:2] + exif + raw[2:]) == ("image/jpeg", 1280, 800)

    def test_unknown_bytes_have_no_size(self) -> None:
        """Bytes that are no supported image give None, never a guess."""
        assert image_size(b"hello world, not an image") is None
        assert image_size(b"\xff\xd8\xff\xda\x00\x02") is None  # scan before any frame

    def test_webp_lossy_and_lossless_headers(self) -> None:
        """VP8 (lossy) and VP8L (lossless) WebP headers are read as well as VP8X."""
        lossy = b"RIFF\x00\x00\x00\x00WEBPVP8 \x00\x00\x00\x00" + b"\x00\x00\x00"
        lossy += b"\x9d\x01\x2a" + (640).to_bytes(2, "little") + (480).to_bytes(2, "little")
        assert image_size(lossy) == ("image/webp", 640, 480)
        bits = (99 & 0x3FFF) | ((49 & 0x3FFF) << 14)
        lossless = b"RIFF\x00\x00\x00\x00WEBPVP8L\x00\x00\x00\x00\x2f" + bits.to_bytes(4, "little")
        lossless += b"\x00" * 8
        assert image_size(lossless) == ("image/webp", 100, 50)
        assert image_size(webp(7, 9)) == ("image/webp", 7, 9)


class TestImagePartValidation:
    """A bad image is refused at construction with the field and what is allowed."""

    def test_bad_base64_names_the_field(self) -> None:
        """Characters outside base64 are a ConfigError on ``data``, with a short preview."""
        with pytest.raises(ConfigError, match=r"ImagePart\.data=.*valid base64"):
            ImagePart("!!" + "A" * 10_000, "image/png")
        with pytest.raises(ConfigError) as info:
            ImagePart("@" * 100_000, "image/png")
        assert len(str(info.value)) < 300  # the payload is never echoed in full

    def test_unknown_media_type_lists_allowed(self) -> None:
        """A media type outside png/jpeg/gif/webp names the allowed ones."""
        data = base64.b64encode(png(2, 2)).decode()
        with pytest.raises(ConfigError, match=r"media_type='image/bmp'.*image/png"):
            ImagePart(data, "image/bmp")

    def test_media_type_must_match_bytes(self) -> None:
        """Declaring PNG for JPEG bytes is refused; omitting the type sniffs it."""
        data = base64.b64encode(jpeg(10, 20)).decode()
        with pytest.raises(ConfigError, match="image/jpeg"):
            ImagePart(data, "image/png")
        assert ImagePart(data).media_type == "image/jpeg"

    def test_empty_or_ambiguous_source(self) -> None:
        """Empty data, no source, or both data and url are each refused."""
        with pytest.raises(ConfigError, match="non-empty"):
            ImagePart("", "image/png")
        with pytest.raises(ConfigError, match="exactly one"):
            ImagePart()
        with pytest.raises(ConfigError, match="exactly one"):
            ImagePart(base64.b64encode(png(1, 1)).decode(), url="https://x/y.png")

    def test_not_an_image(self) -> None:
        """Valid base64 of something that is not an image is refused."""
        with pytest.raises(ConfigError, match="PNG, JPEG, GIF or WebP"):
            ImagePart(base64.b64encode(b"plain text").decode())

    def test_detail_and_size_checked(self) -> None:
        """``detail`` is auto/low/high; a given size must match the header."""
        with pytest.raises(ConfigError, match="detail"):
            ImagePart(url="https://x/a.png", detail="medium")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="header"):
            ImagePart(base64.b64encode(png(4, 4)).decode(), width=5, height=4)
        with pytest.raises(ConfigError, match="both or neither"):
            ImagePart(url="https://x/a.png", width=5)

    def test_data_url_round_trip(self) -> None:
        """A data URL splits into media type and base64, and is rebuilt the same."""
        part = image_part(30, 20)
        again = ImagePart.from_data_url(part.data_url)
        assert again == part and again.size == (30, 20)
        remote = ImagePart.from_data_url("https://example.com/a.png", detail="low")
        assert remote.url == "https://example.com/a.png" and remote.size is None
        with pytest.raises(ConfigError, match="data URL"):
            ImagePart.from_data_url("data:image/png,notbase64")


class TestDocumentPart:
    """PDFs and text files with page counts and validation."""

    def test_pdf_pages_read_from_page_tree(self) -> None:
        """A PDF's page count comes from its page tree."""
        assert pdf_part(3).pages == 3
        assert pdf_part(1).pages == 1

    def test_text_document(self) -> None:
        """A text/plain document keeps its text, decoded on demand."""
        doc = DocumentPart.from_text("héllo", title="a.txt")
        assert doc.text == "héllo" and doc.media_type == "text/plain"

    def test_bad_documents_refused(self) -> None:
        """Non-PDF bytes as PDF, non-UTF-8 text, unknown types and no type are refused."""
        data = base64.b64encode(b"not a pdf").decode()
        with pytest.raises(ConfigError, match="PDF"):
            DocumentPart(data, "application/pdf")
        with pytest.raises(ConfigError, match="UTF-8"):
            DocumentPart(base64.b64encode(b"\xff\xfe\xfa").decode(), "text/plain")
        with pytest.raises(ConfigError, match="application/pdf"):
            DocumentPart(data, "application/msword")
        with pytest.raises(ConfigError, match="media_type"):
            DocumentPart(data)
        assert DocumentPart(url="https://x/a.pdf", pages=4).pages == 4


class TestMessageContent:
    """Messages carry str or parts; ``.text`` keeps working; comparisons stay cheap."""

    def test_str_fast_path_unchanged(self) -> None:
        """A str content stays the same object; ``.text`` is the content."""
        text = "hello"
        message = UserMessage(text)
        assert message.content is text and message.text == text
        assert message.parts == (TextPart("hello"),) and UserMessage("").parts == ()

    def test_parts_content_and_text(self) -> None:
        """A list of parts becomes a tuple; ``.text`` joins the text parts."""
        image = image_part()
        message = UserMessage([TextPart("look"), image, TextPart("here")])
        assert message.content == (TextPart("look"), image, TextPart("here"))
        assert message.text == "look\nhere"
        assert has_media(message.content) and media_parts(message.content) == (image,)
        assert UserMessage(image).content == (image,)

    def test_describe_never_contains_base64(self) -> None:
        """The description names each image and document and leaves out their bytes."""
        image = image_part(1280, 800, label="screenshot")
        doc = pdf_part(2, title="r.pdf")
        text = describe_content((TextPart("see"), image, doc))
        assert text == (
            "see\n[image: screenshot image/png 1280×800]\n"
            "[document: r.pdf application/pdf, 2 pages]"
        )
        assert image.data is not None and image.data[:20] not in text

    def test_tool_results_carry_parts(self) -> None:
        """A tool result built for a call may hold images."""
        call = ToolCall("c1", "screenshot")
        result = ToolResult.for_call(call, [image_part()])
        assert result.parts[0].kind == "image" and result.text == ""

    def test_bad_content_refused(self) -> None:
        """Empty tuples, foreign objects and parts in a system message are refused."""
        with pytest.raises(ConfigError, match="non-empty"):
            UserMessage(())
        with pytest.raises(TypeError, match=r"content\[1\]"):
            UserMessage([TextPart("a"), "b"])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="TextPart"):
            ToolResult("c", 42)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            SystemMessage((TextPart("a"),))  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="non-empty"):
            TextPart("")

    def test_evolve_shares_parts(self) -> None:
        """Evolving a message keeps the same part objects: no payload is copied."""
        image = image_part(800, 600)
        message = UserMessage([image])
        changed = message.evolve(essential=False)
        assert changed.content[0] is image and changed.content is message.content

    def test_equality_and_hash_by_digest(self) -> None:
        """Two images with the same bytes are equal even as distinct strings."""
        raw = png(300, 200)
        a = ImagePart.from_bytes(raw)
        b = ImagePart.from_bytes(raw)
        assert a.data is not b.data and a == b and hash(a) == hash(b)
        assert a != ImagePart.from_bytes(png(300, 201))
        assert a != ImagePart.from_bytes(raw, detail="low")
        assert UserMessage([a]) == UserMessage([b])
        assert hash(UserMessage([a])) == hash(UserMessage([b]))

    def test_content_parts_of_str(self) -> None:
        """A str content reads as one text part."""
        assert content_parts("x") == (TextPart("x"),)


class TestPartJson:
    """Each part has a canonical JSON form that reads back equal."""

    @given(
        st.sampled_from(MEDIA),
        st.integers(min_value=1, max_value=3000),
        st.integers(min_value=1, max_value=3000),
        st.sampled_from([None, "auto", "low", "high"]),
    )
    def test_images_round_trip(self, media: str, w: int, h: int, detail: str | None) -> None:
        """An image's JSON reads back to an equal part."""
        part = ImagePart.from_bytes(image_bytes(media, w, h), detail=detail, label="s")  # type: ignore[arg-type]
        assert part_from_json(part.to_json()) == part

    def test_other_parts_round_trip(self) -> None:
        """Text, URL images, PDFs, text files and URL documents read back equal."""
        for part in (
            TextPart("hi"),
            ImagePart(url="https://x/a.png", width=10, height=20, detail="high"),
            DocumentPart.from_bytes(pdf(2), "application/pdf", title="a.pdf"),
            DocumentPart.from_text("notes"),
            DocumentPart(url="https://x/a.pdf", pages=3),
        ):
            assert part_from_json(part.to_json()) == part

    def test_malformed_json_names_path(self) -> None:
        """An unknown type or field is a ConfigError naming the path."""
        with pytest.raises(ConfigError, match=r"content\[2\]\.type"):
            part_from_json({"type": "audio"}, path="content[2]")
        with pytest.raises(ConfigError, match="content.0"):
            part_from_json({"type": "text", "text": "a", "bold": True}, path="content.0")


class TestBuiltImages:
    """The toolkit's images are what they say."""

    def test_png_is_decodable(self) -> None:
        """The built PNG's pixel data inflates to the declared size."""
        import zlib

        raw = png(5, 3)
        idat = raw.index(b"IDAT")
        length = int.from_bytes(raw[idat - 4 : idat], "big")
        rows = zlib.decompress(raw[idat + 4 : idat + 4 + length])
        assert len(rows) == 3 * (1 + 3 * 5)

    def test_gif_header(self) -> None:
        """The built GIF reads back its size."""
        assert image_size(gif(12, 34)) == ("image/gif", 12, 34)
