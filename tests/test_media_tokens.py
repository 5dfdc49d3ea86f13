"""Image and document token estimates follow the providers' published formulas."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import ConfigError, DocumentPart, ImagePart, TextPart, ToolResult, UserMessage
from tinyctx.media_tokens import (
    PDF_PAGE_TOKENS,
    anthropic_image_size,
    anthropic_image_tokens,
    image_tokens,
    openai_image_size,
    openai_image_tokens,
)
from tinyctx.testing.images import image_part, pdf_part
from tinyctx.tokens import HeuristicCounter

# Anthropic vision docs: "Here are examples of approximate tokenization and costs for
# different image sizes": 200×200 ~54 tokens, 1000×1000 ~1334, 1092×1092 ~1590.
ANTHROPIC_EXAMPLES = [((200, 200), 54), ((1000, 1000), 1334), ((1092, 1092), 1590)]
# Anthropic: "maximum image sizes accepted by our API that will not be resized", per ratio.
ANTHROPIC_NOT_RESIZED = [(1092, 1092), (951, 1268), (896, 1344), (819, 1456), (784, 1568)]
# OpenAI vision docs ("Calculating costs"): 1024×1024 high -> 768×768, 4 tiles, 765 tokens;
# 2048×4096 high -> 1024×2048 -> 768×1536, 6 tiles, 1105 tokens; 4096×8192 low -> 85.
OPENAI_EXAMPLES = [
    ((1024, 1024), "high", (768, 768), 765),
    ((2048, 4096), "high", (768, 1536), 1105),
    ((4096, 8192), "low", None, 85),
]


class TestAnthropicFormula:
    """width×height/750 after the API's resize limits."""

    @pytest.mark.parametrize(("size", "tokens"), ANTHROPIC_EXAMPLES)
    def test_published_examples(self, size: tuple[int, int], tokens: int) -> None:
        """The docs' example sizes cost what the docs say."""
        assert anthropic_image_tokens(*size) == tokens

    @pytest.mark.parametrize("size", ANTHROPIC_NOT_RESIZED)
    def test_table_of_sizes_not_resized(self, size: tuple[int, int]) -> None:
        """Every size in the not-resized table keeps its size and costs about 1,600."""
        assert anthropic_image_size(*size) == size
        assert 1580 <= anthropic_image_tokens(*size) <= 1640

    def test_long_edge_capped(self) -> None:
        """A 2560×1600 screenshot is scaled under the long edge and pixel ceiling."""
        w, h = anthropic_image_size(2560, 1600)
        assert max(w, h) <= 1568 and w * h <= 1568 * 784
        assert abs(w / h - 1.6) < 0.01
        assert anthropic_image_tokens(2560, 1600) == pytest.approx(1640, abs=3)

    @given(st.integers(1, 10_000), st.integers(1, 10_000))
    def test_never_more_than_the_ceiling(self, w: int, h: int) -> None:
        """No image, however large, costs more than the ceiling; small ones are exact."""
        tokens = anthropic_image_tokens(w, h)
        assert 1 <= tokens <= 1640
        if max(w, h) <= 1568 and w * h <= 1568 * 784:
            assert tokens == -(-w * h // 750)


class TestOpenAIFormula:
    """Low detail flat 85; high detail 170 per 512-px tile plus 85 after scaling."""

    @pytest.mark.parametrize(("size", "detail", "scaled", "tokens"), OPENAI_EXAMPLES)
    def test_published_examples(
        self, size: tuple[int, int], detail: str, scaled: tuple[int, int] | None, tokens: int
    ) -> None:
        """The docs' worked examples scale and cost as written."""
        if scaled is not None:
            assert openai_image_size(*size) == scaled
        assert openai_image_tokens(*size, detail) == tokens

    def test_small_images_are_not_upscaled(self) -> None:
        """A 512×512 image is one tile (255 tokens); auto counts as high."""
        assert openai_image_tokens(512, 512, "high") == 255
        assert openai_image_tokens(512, 512, "auto") == 255
        assert openai_image_tokens(100, 100) == 255

    @given(st.integers(1, 10_000), st.integers(1, 10_000))
    def test_scaled_size_within_limits(self, w: int, h: int) -> None:
        """The tiled size fits 2048² and its short side is at most 768."""
        sw, sh = openai_image_size(w, h)
        assert max(sw, sh) <= 2048 and min(sw, sh) <= 768
        assert 255 <= openai_image_tokens(w, h, "high") <= 1445


class TestPartsAndCounters:
    """Counters add media tokens by their formula and stay memoized."""

    def test_image_part_by_formula(self) -> None:
        """The part's header size feeds the chosen formula; unknown sizes cost the most."""
        part = image_part(1000, 1000)
        assert image_tokens(part, "anthropic") == 1334
        assert image_tokens(part, "openai") == 765
        low = ImagePart(part.data, detail="low")
        assert image_tokens(low, "openai") == 85
        remote = ImagePart(url="https://x/a.png")
        assert image_tokens(remote, "anthropic") == 1640
        assert image_tokens(remote, "openai") == 1445

    def test_message_count_includes_images(self) -> None:
        """A user message with an image costs its text plus the image."""
        counter = HeuristicCounter()
        text_only = counter.count_message(UserMessage("look at this"))
        with_image = counter.count_message(
            UserMessage([TextPart("look at this"), image_part(200, 200)])
        )
        assert with_image == text_only + 54
        openai = HeuristicCounter(images="openai")
        assert openai.count_message(UserMessage([image_part(200, 200)])) == 4 + 255

    def test_base64_is_never_counted_as_text(self) -> None:
        """A large image costs its formula, not its base64 length."""
        part = image_part(2560, 1600)
        counter = HeuristicCounter()
        result = ToolResult("c1", [part])
        assert counter.count_message(result) < 1700

    def test_documents(self) -> None:
        """A PDF costs per page; a text file costs its text."""
        counter = HeuristicCounter()
        pdf = counter.count_message(UserMessage([pdf_part(3)]))
        assert pdf == 4 + 3 * PDF_PAGE_TOKENS
        text = "word " * 300
        doc = counter.count_message(UserMessage([DocumentPart.from_text(text)]))
        assert doc == counter.count_message(UserMessage(text))

    def test_memoized(self) -> None:
        """Counting the same message again is a lookup: the memo grows once."""
        counter = HeuristicCounter()
        message = UserMessage([image_part(300, 300)])
        first = counter.count_messages((message,))
        size = counter.memo_size
        assert counter.count_messages((message,)) == first and counter.memo_size == size

    def test_bad_formula_refused(self) -> None:
        """An unknown image formula names the allowed ones."""
        with pytest.raises(ConfigError, match="anthropic"):
            HeuristicCounter(images="gemini")  # type: ignore[arg-type]
