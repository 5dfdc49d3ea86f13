"""Images and documents go through the real OpenAI and Anthropic SDKs to a loopback server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.loopback import (
    TRIO_ASYNCGEN_WARNING,
    LoopbackServer,
    anthropic_client,
    anthropic_message,
    json_reply,
    openai_client,
    openai_completion,
)
from tinyctx import (
    Agent,
    DocumentPart,
    ImagePart,
    ModelRequest,
    RunContext,
    Session,
    TextPart,
    UserMessage,
    tool,
)
from tinyctx.formats import FormatError
from tinyctx.providers import AnthropicModel, OpenAIChatModel
from tinyctx.testing.images import image_part, pdf_part

pytestmark = pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING)

SCREEN = image_part(1280, 800, "image/png", label="screenshot")
PDF = pdf_part(2, title="spec.pdf")


@tool
def screenshot() -> ImagePart:
    """Take a screenshot of the screen."""
    return SCREEN


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as loopback:
        yield loopback
    assert loopback.unexpected == [], "the client sent more requests than the test scripted"


def _question() -> UserMessage:
    return UserMessage([TextPart("What is on screen? See the spec."), PDF])


class TestAnthropicAdapter:
    """Anthropic takes images and documents in user turns and in tool results."""

    async def test_parts_sent_in_user_turns_and_tool_results(self, server: LoopbackServer) -> None:
        """A tool's screenshot goes back as an image block inside its tool_result."""
        server.add(
            json_reply(
                anthropic_message(
                    [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]
                )
            ),
            json_reply(anthropic_message([{"type": "text", "text": "A login page."}])),
        )
        async with anthropic_client(server) as client:
            model = AnthropicModel("claude-sonnet-4-6", client=client, cache_prefix=False)
            async with Session(Agent(model, tools=[screenshot])) as session:
                result = await session.run(_question())
                history = session.conversation_messages
        assert result.final_text == "A login page."
        assert history[2].content == (SCREEN,)
        first, second = (r.json() for r in server.requests)
        assert first["messages"][0]["content"] == [
            {"type": "text", "text": "What is on screen? See the spec."},
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": PDF.data},
                "title": "spec.pdf",
            },
        ]
        assert second["messages"][2]["content"] == [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": SCREEN.data,
                        },
                    }
                ],
            }
        ]

    async def test_url_image_and_text_document(self, server: LoopbackServer) -> None:
        """URL images and text files use Anthropic's url and text sources."""
        server.add(json_reply(anthropic_message([{"type": "text", "text": "ok"}])))
        message = UserMessage(
            [ImagePart(url="https://example.com/a.png"), DocumentPart.from_text("notes")]
        )
        async with anthropic_client(server) as client:
            model = AnthropicModel("claude-sonnet-4-6", client=client, cache_prefix=False)
            await model(ModelRequest((message,)), RunContext.new())
        sent: list[dict[str, Any]] = server.requests[0].json()["messages"][0]["content"]
        assert sent == [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "notes"},
            },
        ]


class TestOpenAIAdapter:
    """OpenAI takes images and files in user messages; tool media follow in a user turn."""

    async def test_tool_images_follow_in_a_user_message(self, server: LoopbackServer) -> None:
        """A tool message carries text naming the image; the image is sent right after."""
        server.add(
            json_reply(openai_completion(None, [("call_1", "screenshot", "{}")])),
            json_reply(openai_completion("A login page.")),
        )
        async with openai_client(server) as client:
            model = OpenAIChatModel("gpt-4o", client=client)
            async with Session(Agent(model, tools=[screenshot])) as session:
                result = await session.run(_question())
        assert result.final_text == "A login page."
        first, second = (r.json() for r in server.requests)
        assert first["messages"][0]["content"] == [
            {"type": "text", "text": "What is on screen? See the spec."},
            {"type": "file", "file": {"file_data": PDF.data_url, "filename": "spec.pdf"}},
        ]
        tool_message, attached = second["messages"][2], second["messages"][3]
        assert tool_message == {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": "[image: screenshot image/png 1280×800, attached below]",
        }
        assert attached == {
            "role": "user",
            "content": [
                {"type": "text", "text": "Attached by tool call call_1:"},
                {"type": "image_url", "image_url": {"url": SCREEN.data_url}},
            ],
        }

    async def test_a_document_by_url_is_a_clear_error(self, server: LoopbackServer) -> None:
        """OpenAI chat cannot take a file by URL: an error names it and nothing is sent."""
        message = UserMessage([DocumentPart(url="https://example.com/a.pdf")])
        async with openai_client(server) as client:
            model = OpenAIChatModel("gpt-4o", client=client)
            with pytest.raises(
                FormatError, match="message 0: cannot express a document given by URL"
            ):
                await model(ModelRequest((message,)), RunContext.new())
        assert server.requests == []

    async def test_detail_is_sent(self, server: LoopbackServer) -> None:
        """An image's detail level reaches OpenAI."""
        server.add(json_reply(openai_completion("ok")))
        low = ImagePart(SCREEN.data, detail="low")
        async with openai_client(server) as client:
            model = OpenAIChatModel("gpt-4o", client=client)
            await model(ModelRequest((UserMessage([low]),)), RunContext.new())
        part = server.requests[0].json()["messages"][0]["content"][0]
        assert part == {"type": "image_url", "image_url": {"url": SCREEN.data_url, "detail": "low"}}
