"""A model handler over the OpenAI Responses API (``pip install 'tinyctx[openai]'``).

``OpenAIResponsesModel("gpt-5")`` calls ``client.responses.create`` of the official SDK,
statelessly by default (``store=False``, every request carries the thread, reasoning
items travel with their encrypted content), or with ``previous_response_id`` chaining
(``chain=True``, which needs ``store=True``). The items encoding is in
:mod:`tinyctx.providers._responses_items`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

try:
    import openai
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tinyctx.providers.openai_responses needs the OpenAI SDK: pip install 'tinyctx[openai]'"
    ) from exc
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseIncompleteEvent,
    ResponseOutputItemAddedEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseRefusalDeltaEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ResponseUsage,
)

from ..config import flag
from ..context import RunContext
from ..errors import ConfigError, ContextLimitExceeded, ProviderError
from ..formats import FormatError
from ..frozen import thaw
from ..messages import AssistantMessage, Message
from ..model import ModelRequest, ModelResponse, Usage
from ..tokens import REASONING_TOKENS
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
from ._responses_items import ITEMS, RESPONSES, assistant_from_output, to_responses_input
from .openai import openai_error

__all__ = ["OpenAIResponsesModel", "ENCRYPTED_REASONING", "CLIENT_RUN_ITEMS"]

PROVIDER: Final = "openai"
_OWNER: Final = "OpenAIResponsesModel"
_BUILT: Final = frozenset(
    {"input", "instructions", "model", "previous_response_id", "store", "stream", "tools"}
)
ENCRYPTED_REASONING: Final = "reasoning.encrypted_content"
"""The ``include`` entry a stateless request adds, so reasoning can be sent back."""
CLIENT_RUN_ITEMS: Final = frozenset(
    {
        "custom_tool_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "mcp_approval_request",
    }
)
"""Output items the client would have to run; tinyctx tools are functions."""
RESPONSE_ID: Final = "response_id"


def _usage(usage: ResponseUsage | None) -> Usage | None:
    if usage is None:
        return None
    details = usage.input_tokens_details
    output = usage.output_tokens_details
    return Usage(
        usage.input_tokens,
        usage.output_tokens,
        (details.cached_tokens or 0) if details is not None else 0,
        reasoning_tokens=(output.reasoning_tokens or 0) if output is not None else 0,
    )


def _finish(response: Response) -> list[str | None]:
    """``status`` of the response, or the reason it is incomplete."""
    details = response.incomplete_details
    if response.status == "incomplete" and details is not None and details.reason:
        return [details.reason]
    return [response.status]


def _failure(response: Response) -> ContextLimitExceeded | ProviderError | None:
    """The error a failed response carries (None when it did not fail)."""
    if response.status != "failed" and response.error is None:
        return None
    error = response.error
    body = (
        {"error": {"code": error.code, "type": error.code, "message": error.message}}
        if error
        else None
    )
    message = error.message if error else "the response failed"
    return classify(PROVIDER, kind="stream", message=message, body=body)


class _StreamState:
    """Emits text and function-call deltas of a response stream; keeps the final response."""

    __slots__ = ("calls", "ctx", "error", "final")

    def __init__(self, ctx: RunContext[Any]) -> None:
        self.ctx = ctx
        self.calls: dict[int, int] = {}  # output index -> tool call index
        self.final: Response | None = None
        self.error: ContextLimitExceeded | ProviderError | None = None

    def handle(self, event: ResponseStreamEvent) -> None:
        if isinstance(event, (ResponseTextDeltaEvent, ResponseRefusalDeltaEvent)):
            emit_text(self.ctx, event.delta)
        elif isinstance(
            event, (ResponseReasoningSummaryTextDeltaEvent, ResponseReasoningTextDeltaEvent)
        ):
            emit_reasoning(self.ctx, event.delta)
        elif isinstance(event, ResponseOutputItemAddedEvent):
            item = event.item
            if item.type == "function_call":
                index = self.calls[event.output_index] = len(self.calls)
                emit_tool_delta(self.ctx, index, call_id=item.call_id, name=item.name)
        elif isinstance(event, ResponseFunctionCallArgumentsDeltaEvent):
            at = self.calls.get(event.output_index)
            if at is not None:
                emit_tool_delta(self.ctx, at, arguments=event.delta)
        elif isinstance(
            event, (ResponseCompletedEvent, ResponseIncompleteEvent, ResponseFailedEvent)
        ):
            self.final = event.response
        elif isinstance(event, ResponseErrorEvent):
            # a Responses error names its kind in ``code`` (server_error, rate_limit_exceeded)
            body = {"error": {"code": event.code, "type": event.code, "message": event.message}}
            self.error = classify(PROVIDER, kind="stream", message=event.message, body=body)


class OpenAIResponsesModel(SDKModel[openai.AsyncOpenAI]):
    """A tinyctx model handler over the OpenAI Responses API (``openai.AsyncOpenAI``).

    ``OpenAIResponsesModel("gpt-5", client=None, stream=False, store=False, chain=False,
    **settings)``: ``settings`` are keyword arguments of ``client.responses.create``
    (``reasoning``, ``temperature``, ``max_output_tokens``, ``include``, ``tool_choice``,
    ``truncation``...), checked at construction; a request's settings override them per
    call, and ``request.settings["stream"]`` overrides ``stream``.

    Each call sends the system prompt as ``instructions``, the thread as input items, the
    tools as function tools (``strict: false``: tinyctx schemas need not be strict) and
    the server tools as given (``ServerTool("web_search")``, ``ServerTool("file_search",
    {"vector_store_ids": [...]})``: ``{"type": tool.type, **configuration}``).

    ``store=False`` (the default) is stateless: the server keeps nothing, each request
    sends the whole thread and asks for ``reasoning.encrypted_content``, and the reasoning
    items a response returns are kept with its assistant message (metadata
    ``"openai_responses"``) and sent back with it, so a compaction that keeps, drops or
    summarizes that turn moves its reasoning with it. ``chain=True`` (with
    ``store=True``) sends only the messages after the last stored response and its
    ``previous_response_id``: the server then holds the context, and what tinyctx compacts
    before that response no longer changes what the model reads.

    Streaming, cancellation and errors behave as for
    :class:`tinyctx.providers.openai.OpenAIChatModel`; an error event or a failed response
    in a stream is classified by its code (``rate_limit_exceeded``, ``server_error`` are
    retryable).
    """

    provider = PROVIDER
    provider_name = "openai"
    max_tokens_keys = ("max_output_tokens",)

    def __init__(
        self,
        model: str,
        client: openai.AsyncOpenAI | None = None,
        *,
        stream: bool = False,
        store: bool = False,
        chain: bool = False,
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
            client_type=openai.AsyncOpenAI,
            build=lambda: openai.AsyncOpenAI(api_key=api_key, base_url=base_url),
            sdk_error=openai.OpenAIError,
            credentials="an openai.AsyncOpenAI, or api_key= / OPENAI_API_KEY",
        )
        flag().check(store, "store", _OWNER)
        flag().check(chain, "chain", _OWNER)
        if chain and not store:
            raise ConfigError(
                "chain",
                chain,
                "False unless store=True (previous_response_id needs a stored response)",
                owner=_OWNER,
            )
        self.store = store
        self.chain = chain
        self.settings = check_settings(settings, sdk.responses.create, built=_BUILT, owner=_OWNER)

    # -- the request ---------------------------------------------------------------------

    def _since_last_response(self, messages: Sequence[Message]) -> tuple[str | None, int]:
        """``(previous_response_id, index of the first message to send)`` in chain mode."""
        if not self.chain:
            return None, 0
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if isinstance(message, AssistantMessage):
                own = message.metadata.get(RESPONSES, None)
                response_id = own.get(RESPONSE_ID) if isinstance(own, Mapping) else None
                if isinstance(response_id, str) and response_id:
                    return response_id, index + 1
        return None, 0

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments this request becomes for ``responses.create``."""
        settings = self.call_settings(request, self.client.responses.create, built=_BUILT)
        previous, start = self._since_last_response(request.messages)
        try:
            items = to_responses_input(request.messages[start:])
        except FormatError as exc:
            raise ConfigError(
                f"request.messages[{start + (exc.index or 0)}]",
                request.messages[start + (exc.index or 0)].role,
                f"a message the Responses API can take ({exc.reason})",
                owner=_OWNER,
            ) from exc
        params: dict[str, Any] = {
            "model": request.model or self.model,
            "input": items,
            "store": self.store,
        }
        if previous is not None:
            params["previous_response_id"] = previous
        if request.system_prompt:
            params["instructions"] = request.system_prompt
        tools: list[dict[str, Any]] = []
        for spec in request.tools:
            tool: dict[str, Any] = {
                "type": "function",
                "name": spec.name,
                "parameters": thaw(spec.parameters),
                "strict": False,
            }
            if spec.description:
                tool["description"] = spec.description
            tools.append(tool)
        tools.extend(server_tool_json(server_tool) for server_tool in request.server_tools)
        if tools:
            params["tools"] = tools
        params.update(settings)
        if not self.store:
            include = list(params.get("include") or ())
            if ENCRYPTED_REASONING not in include:
                include.append(ENCRYPTED_REASONING)
            params["include"] = include
        return params

    # -- the call ------------------------------------------------------------------------

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any], /) -> ModelResponse:
        stream = self.streaming(request)
        params = self.request_params(request)
        try:
            if stream:
                response = await self._call_streaming(params, ctx)
            else:
                with ctx.cancellation.linked_scope("model_call"):
                    response = await self.client.responses.create(**params)
        except openai.OpenAIError as exc:
            raise openai_error(exc) from exc
        failure = _failure(response)
        if failure is not None:
            raise failure
        return self._response(response, params)

    def _response(self, response: Response, params: Mapping[str, Any]) -> ModelResponse:
        output = [item.to_dict(mode="json", exclude_none=True) for item in response.output]
        for item in output:
            if item.get("type") in CLIENT_RUN_ITEMS:
                raise ProviderError(
                    f"{PROVIDER}: cannot run a {item['type']!r} output item; tinyctx tools are "
                    "functions (give the model function tools, or handle it in a layer)",
                    provider=PROVIDER,
                )
        try:
            message = assistant_from_output(output)
        except FormatError as exc:
            raise unreadable(PROVIDER, exc) from exc
        usage = _usage(response.usage)
        metadata = dict(message.metadata)
        own = dict(metadata.get(RESPONSES) or {})
        own[RESPONSE_ID] = response.id
        metadata[RESPONSES] = own
        reasoning = any(item.get("type") == "reasoning" for item in own.get(ITEMS, ()))
        if usage is not None and usage.reasoning_tokens and reasoning:
            # what the reasoning items sent back with this turn cost, as the response said
            metadata["tinyctx"] = {REASONING_TOKENS: usage.reasoning_tokens}
        info = self.call_info(
            params,
            model=str(params["model"]),
            response_id=response.id,
            finish_reasons=_finish(response),
        )
        return ModelResponse(
            message.evolve(metadata=metadata),
            usage=usage,
            model=response.model,
            raw=response,
            info=info,
        )

    async def _call_streaming(self, params: Mapping[str, Any], ctx: RunContext[Any]) -> Response:
        state = _StreamState(ctx)
        body = {**params, "stream": True}
        await consume_stream(
            ctx,
            lambda: self.client.responses.create(**body),
            lambda stream: stream,
            lambda stream: stream.close(),
            state.handle,
        )
        if state.error is not None:
            raise state.error
        if state.final is None:
            raise ProviderError(
                f"{PROVIDER}: the stream ended before the response completed", provider=PROVIDER
            )
        return state.final
