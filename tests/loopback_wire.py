"""The wire formats of the OpenAI Responses API and the Gemini API, for the loopback server
(tests/loopback.py): response bodies and SSE event lists the real SDKs read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import google.genai
import httpx2
from google.genai import types as genai_types

from tests.loopback import LoopbackServer

__all__ = [
    "responses_body",
    "responses_stream",
    "reasoning_item",
    "message_item",
    "function_call_item",
    "gemini_body",
    "gemini_stream",
    "gemini_client",
    "close_gemini",
]


# ---------------------------------------------------------------------------------------
# OpenAI Responses


def reasoning_item(item_id: str, summary: str, encrypted: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": summary}],
    }
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


def message_item(text: str, item_id: str = "msg_1") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call_item(call_id: str, name: str, arguments: str, item_id: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": "completed",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def responses_body(
    output: Sequence[dict[str, Any]],
    *,
    response_id: str = "resp_1",
    model: str = "gpt-5-2025-08-07",
    usage: tuple[int, int, int, int] = (30, 12, 0, 0),
    status: str = "completed",
    incomplete: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A response; ``usage`` is (input, output, cached input, reasoning)."""
    given, produced, cached, reasoning = usage
    return {
        "id": response_id,
        "object": "response",
        "created_at": 1_700_000_000,
        "model": model,
        "status": status,
        "output": list(output),
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": given,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": produced,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": given + produced,
        },
    }


def responses_stream(
    output: Sequence[dict[str, Any]],
    *,
    text_pieces: Sequence[str] = (),
    argument_pieces: Sequence[Sequence[str]] = (),
    done: bool = True,
    error: dict[str, Any] | None = None,
    **body: Any,
) -> list[tuple[str | None, Any]]:
    """Stream events for ``output``: each item added, its text or arguments in pieces (the
    message's ``text_pieces``; each function call's ``argument_pieces`` in order), done,
    then ``response.completed`` with the whole response (``done=False`` stops before it;
    ``error`` sends an error event there instead)."""
    sequence = iter(range(1, 10_000))
    events: list[tuple[str | None, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": next(sequence), **fields}))

    whole = responses_body(output, **body)
    add("response.created", response={**whole, "status": "in_progress", "output": []})
    calls = iter(argument_pieces)
    for index, item in enumerate(output):
        kind = item["type"]
        if kind == "function_call":
            add("response.output_item.added", output_index=index, item={**item, "arguments": ""})
            for piece in next(calls, [item["arguments"]]):
                add(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=piece,
                )
        elif kind == "message":
            add("response.output_item.added", output_index=index, item={**item, "content": []})
            for piece in text_pieces:
                add(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    delta=piece,
                    logprobs=[],
                )
        else:
            add("response.output_item.added", output_index=index, item=item)
        add("response.output_item.done", output_index=index, item=item)
    if error is not None:
        add("error", **error)
        return events
    if done:
        add("response.completed", response=whole)
    return events


# ---------------------------------------------------------------------------------------
# Gemini


def gemini_body(
    parts: Sequence[dict[str, Any]],
    *,
    model_version: str = "gemini-2.5-flash-001",
    usage: tuple[int, int, int, int] = (20, 6, 0, 0),
    finish: str | None = "STOP",
    response_id: str = "gem-resp-1",
) -> dict[str, Any]:
    """A generateContent response; ``usage`` is (prompt, candidates, cached, thoughts)."""
    prompt, candidates, cached, thoughts = usage
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    metadata: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + thoughts,
    }
    if cached:
        metadata["cachedContentTokenCount"] = cached
    if thoughts:
        metadata["thoughtsTokenCount"] = thoughts
    return {
        "candidates": [candidate],
        "usageMetadata": metadata,
        "modelVersion": model_version,
        "responseId": response_id,
    }


def gemini_stream(
    chunks: Sequence[Sequence[dict[str, Any]]], **body: Any
) -> list[tuple[str | None, Any]]:
    """``streamGenerateContent?alt=sse`` events: one response per chunk of parts, usage
    and the finish reason on the last."""
    events: list[tuple[str | None, Any]] = []
    for position, parts in enumerate(chunks):
        last = position == len(chunks) - 1
        chunk = gemini_body(parts, **body)
        if not last:
            chunk["candidates"][0].pop("finishReason", None)
            chunk.pop("usageMetadata")
        events.append((None, chunk))
    return events


def gemini_client(server: LoopbackServer) -> google.genai.Client:
    """The real google-genai client pointed at ``server`` (its own httpx2 client, which
    runs on trio and asyncio alike)."""
    return google.genai.Client(
        api_key="test-key",
        http_options=genai_types.HttpOptions(
            base_url=server.url, httpx_async_client=httpx2.AsyncClient()
        ),
    )


async def close_gemini(client: google.genai.Client) -> None:
    """Close a :func:`gemini_client` and the httpx2 client under it (the SDK closes only
    the clients it made)."""
    await client.aio.aclose()
    http = client._api_client._http_options.httpx_async_client
    if http is not None:
        await http.aclose()
