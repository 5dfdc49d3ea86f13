"""A model handler over the official Anthropic SDK (``pip install 'tinyctx[anthropic]'``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

try:
    import anthropic
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tinyctx.providers.anthropic needs the Anthropic SDK: pip install 'tinyctx[anthropic]'"
    ) from exc
from anthropic.lib.streaming import AsyncMessageStream, ParsedMessageStreamEvent
from anthropic.types import Message as AnthropicMessage
from anthropic.types import Usage as AnthropicUsage

from ..config import flag, integer, one_of, optional
from ..context import RunContext
from ..errors import ContextLimitExceeded, ProviderError, TinyCtxError
from ..formats import FormatError, to_anthropic
from ..formats._common import EXTENSION_KEY, keepable, parse_arguments
from ..formats.anthropic import read_anthropic_assistant
from ..frozen import thaw
from ..messages import AssistantMessage
from ..model import ModelRequest, ModelResponse, Usage
from ._base import (
    SDKModel,
    check_settings,
    consume_stream,
    emit_reasoning,
    emit_text,
    emit_tool_delta,
    server_tool_json,
    unreadable,
)
from ._errors import classify
from .anthropic_context import add_context_edits

__all__ = ["AnthropicModel", "anthropic_error", "mark_cache_prefix", "DEFAULT_MAX_TOKENS"]

PROVIDER: Final = "anthropic"
_OWNER: Final = "AnthropicModel"
_MAX_TOKENS = integer(minimum=1)
_CACHE_TTL = optional(one_of(("5m", "1h")), allowed="None, '5m' or '1h'")
_BUILT: Final = frozenset({"messages", "model", "stream", "system", "tools"})
DEFAULT_MAX_TOKENS: Final = 4096
_UNMARKABLE: Final = frozenset({"thinking", "redacted_thinking"})
CacheTTL = Literal["5m", "1h"]


def anthropic_error(exc: anthropic.AnthropicError) -> ContextLimitExceeded | ProviderError:
    """The tinyctx error for an Anthropic SDK exception (see ``tinyctx.providers._errors``).

    An error event in the middle of a stream arrives as a status error of the 200
    response; its body's ``error.type`` (``overloaded_error``...) decides.
    """
    if isinstance(exc, anthropic.APIConnectionError):
        return classify(PROVIDER, kind="connection", message=exc.message)
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        return classify(
            PROVIDER,
            kind="stream" if status < 400 else "status",
            message=exc.message,
            status=status if status >= 400 else None,
            headers=exc.response.headers,
            body=exc.body,
        )
    return ProviderError(f"{PROVIDER}: {type(exc).__name__}: {exc}", provider=PROVIDER)


def _usage(usage: AnthropicUsage) -> Usage:
    """Anthropic counts cache reads and writes apart from ``input_tokens``; tinyctx's input
    is the whole prompt, of which ``cached_tokens`` were read from the cache."""
    read = usage.cache_read_input_tokens or 0
    written = usage.cache_creation_input_tokens or 0
    return Usage(usage.input_tokens + read + written, usage.output_tokens, read)


def _block(block: Any, invalid: dict[str, str]) -> dict[str, Any]:
    """A content block as the format reads it. A tool_use input a thread could not keep
    (nested past MAX_NESTING, or past what pydantic serializes; NaN...) becomes invalid
    arguments: ``{}`` as its input and its text in ``invalid`` by call id, so that call gets
    an error result instead of the whole response failing, and the thread keeps no copy of
    it in metadata."""
    try:
        dumped: dict[str, Any] = block.to_dict(mode="json", exclude_none=True)
    except ValueError:
        if getattr(block, "type", None) != "tool_use":
            raise
    else:
        if dumped.get("type") != "tool_use" or keepable(dumped.get("input")):
            return dumped
    invalid[block.id] = parse_arguments(block.input)[1] or "{}"
    return {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}


def _assistant(message: AnthropicMessage) -> AssistantMessage:
    invalid: dict[str, str] = {}
    raw: dict[str, Any] = {
        "role": "assistant",
        "content": [_block(block, invalid) for block in message.content],
    }
    if invalid:
        raw[EXTENSION_KEY] = {"invalid_arguments": invalid}
    try:
        return read_anthropic_assistant(raw)
    except FormatError as exc:
        raise unreadable(PROVIDER, exc) from exc


def _mark(blocks: Any, control: dict[str, str]) -> bool:
    """Put ``cache_control`` on the last block that can carry it; False if none can."""
    if not isinstance(blocks, list):
        return False
    for block in reversed(blocks):
        if isinstance(block, dict) and block.get("type") not in _UNMARKABLE:
            block["cache_control"] = dict(control)
            return True
    return False


def mark_cache_prefix(params: dict[str, Any], ttl: CacheTTL | None = None) -> None:
    """Mark the stable prefix of a Messages request for prompt caching, in place.

    Breakpoints (at most 4, as the API allows): the last tool, the last system block, the
    last message (what the next call will find cached), and the last message before the
    final assistant turn, which is where the previous call of the loop put its last
    breakpoint, so its cache is read even when a turn added many blocks. A prefix only
    stays cached while it stays byte-identical: layers that compact persistently
    (``ctx.conversation.replace(..., emit_new=False)``) keep it so.
    """
    control = {"type": "ephemeral"} if ttl is None else {"type": "ephemeral", "ttl": ttl}
    _mark(params.get("tools"), control)
    _mark(params.get("system"), control)
    messages = params.get("messages") or []
    if messages:
        _mark(messages[-1].get("content"), control)
        last_assistant = next(
            (i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"),
            None,
        )
        if last_assistant is not None and last_assistant > 0:
            _mark(messages[last_assistant - 1].get("content"), control)


class AnthropicModel(SDKModel[anthropic.AsyncAnthropic]):
    """A tinyctx model handler over the Anthropic Messages API (``anthropic.AsyncAnthropic``).

    ``AnthropicModel("claude-sonnet-4-6", client=None, stream=False, max_tokens=4096,
    cache_prefix=True, cache_ttl=None, **settings)``: ``settings`` are keyword arguments of
    ``client.messages.create`` (``thinking``, ``tool_choice``, ``stop_sequences``,
    ``extra_body``...), checked at construction; a request's settings override them per
    call (``max_tokens`` and ``stream`` included). The request's ``model`` wins when set.

    The system prompt and the history's leading system messages become ``system``; the
    messages go through ``tinyctx.formats`` in API mode (tool results first in their user
    turn; thinking and server-tool blocks of earlier turns sent back unchanged); tools
    become ``input_schema`` definitions and server tools are sent as given
    (``{"type": tool.type, **configuration}``). ``cache_prefix`` marks the stable prefix
    with ``cache_control`` (see :func:`mark_cache_prefix`); turn it off when you pass the
    API's top-level automatic ``cache_control`` setting instead.

    Streaming, cancellation and errors behave as for
    :class:`tinyctx.providers.openai.OpenAIChatModel`; a 529 overload, also when it arrives
    as an error event inside a stream, is a RetryableProviderError.
    """

    provider = PROVIDER
    provider_name = "anthropic"
    supports_prefill = True  # a trailing assistant message is continued

    def __init__(
        self,
        model: str,
        client: anthropic.AsyncAnthropic | None = None,
        *,
        stream: bool = False,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        cache_prefix: bool = True,
        cache_ttl: CacheTTL | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        **settings: Any,
    ) -> None:
        sdk = self._adopt(
            model,
            client,
            stream=stream,
            base_url=base_url,
            api_key=api_key,
            client_type=anthropic.AsyncAnthropic,
            build=lambda: anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url),
            sdk_error=anthropic.AnthropicError,
            credentials="an anthropic.AsyncAnthropic, or api_key= / ANTHROPIC_API_KEY",
        )
        flag().check(cache_prefix, "cache_prefix", _OWNER)
        _MAX_TOKENS.check(max_tokens, "max_tokens", _OWNER)
        _CACHE_TTL.check(cache_ttl, "cache_ttl", _OWNER)
        self.max_tokens = max_tokens
        self.cache_prefix = cache_prefix
        self.cache_ttl = cache_ttl
        self.settings = check_settings(
            settings, sdk.messages.create, built=_BUILT | {"max_tokens"}, owner=_OWNER
        )

    # -- the request ---------------------------------------------------------------------

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments this request becomes for ``messages.create``."""
        settings = self.call_settings(
            request, self.client.messages.create, built=_BUILT, consumed=("stream", "max_tokens")
        )
        max_tokens = request.settings.get("max_tokens", self.max_tokens)
        _MAX_TOKENS.check(max_tokens, "request.settings['max_tokens']", _OWNER)
        converted = to_anthropic(request.messages, for_api=True)
        system: list[dict[str, Any]] = []
        if request.system_prompt:
            system.append({"type": "text", "text": request.system_prompt})
        system.extend(converted.get("system", ()))
        params: dict[str, Any] = {
            "model": request.model or self.model,
            "max_tokens": max_tokens,
            "messages": converted["messages"],
        }
        if system:
            params["system"] = system
        tools: list[dict[str, Any]] = []
        for spec in request.tools:
            tool: dict[str, Any] = {"name": spec.name, "input_schema": thaw(spec.parameters)}
            if spec.description:
                tool["description"] = spec.description
            tools.append(tool)
        tools.extend(server_tool_json(server_tool) for server_tool in request.server_tools)
        if tools:
            params["tools"] = tools
        params.update(settings)
        add_context_edits(params, request)
        if self.cache_prefix:
            mark_cache_prefix(params, self.cache_ttl)
        return params

    # -- the call ------------------------------------------------------------------------

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any], /) -> ModelResponse:
        stream = self.streaming(request)
        params = self.request_params(request)
        try:
            if stream:
                message = await self._call_streaming(params, ctx)
            else:
                with ctx.cancellation.linked_scope("model_call"):
                    message = await self.client.messages.create(**params)
        except anthropic.AnthropicError as exc:
            raise anthropic_error(exc) from exc
        info = self.call_info(
            params,
            model=str(params["model"]),
            response_id=message.id,
            finish_reasons=[message.stop_reason],
        )
        return ModelResponse(
            _assistant(message),
            usage=_usage(message.usage),
            model=message.model,
            raw=message,
            info=info,
        )

    async def _call_streaming(
        self, params: Mapping[str, Any], ctx: RunContext[Any]
    ) -> AnthropicMessage:
        manager = self.client.messages.stream(**params)
        tool_index: dict[int, int] = {}  # content block index -> tool call index
        compactions: dict[int, list[Any]] = {}  # block index -> its compaction_delta events
        iterations: list[Any] = []  # the final usage's per-step counts (the snapshot drops them)

        def handle(event: ParsedMessageStreamEvent[Any]) -> None:
            if event.type == "message_delta":
                iterations[:] = getattr(event.usage, "iterations", None) or iterations
            elif event.type == "content_block_start":
                block = event.content_block
                if block.type == "tool_use":
                    tool_index[event.index] = len(tool_index)
                    emit_tool_delta(ctx, tool_index[event.index], call_id=block.id, name=block.name)
            elif event.type == "content_block_delta":
                delta = event.delta
                if delta.type == "text_delta":
                    emit_text(ctx, delta.text)
                elif delta.type == "thinking_delta":
                    emit_reasoning(ctx, delta.thinking)
                elif delta.type == "input_json_delta" and event.index in tool_index:
                    emit_tool_delta(ctx, tool_index[event.index], arguments=delta.partial_json)
                elif str(delta.type) == "compaction_delta":  # the SDK's snapshot drops these
                    compactions.setdefault(event.index, []).append(delta)

        async def close(stream: AsyncMessageStream[Any]) -> None:
            await manager.__aexit__(None, None, None)

        try:
            stream = await consume_stream(
                ctx, manager.__aenter__, lambda stream: stream, close, handle
            )
        except ValueError as exc:
            if isinstance(exc, TinyCtxError):
                raise
            # the SDK could not parse a tool's streamed JSON input
            raise ProviderError(f"{PROVIDER}: {exc}", provider=PROVIDER) from exc
        try:
            message = stream.current_message_snapshot
        except AssertionError:  # the SDK asserts when no message_start arrived
            raise ProviderError(
                f"{PROVIDER}: the stream ended before a message started", provider=PROVIDER
            ) from None
        for index, deltas in compactions.items():
            _fill_compaction(message.content[index], deltas)
        if iterations:
            message.usage.iterations = iterations  # type: ignore[attr-defined]
        return message


def _fill_compaction(block: Any, deltas: list[Any]) -> None:
    """Put a streamed compaction block's summary (and opaque state) on the snapshot's
    block, as the non-streaming response carries them, so the thread sends it back whole."""
    texts = [d.content for d in deltas if isinstance(getattr(d, "content", None), str)]
    if texts:
        block.content = "".join(texts)
    opaque = [d.encrypted_content for d in deltas if getattr(d, "encrypted_content", None)]
    if opaque:
        block.encrypted_content = opaque[-1]
