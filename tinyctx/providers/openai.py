"""A model handler over the official OpenAI SDK (``pip install 'tinyctx[openai]'``).

``OpenAIChatModel("gpt-4o")`` speaks the chat-completions API through ``openai.AsyncOpenAI``,
so it also talks to any OpenAI-compatible server (vLLM, llama.cpp, Ollama) through the
client's ``base_url``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Final

try:
    import openai
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tinyctx.providers.openai needs the OpenAI SDK: pip install 'tinyctx[openai]'"
    ) from exc
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion_usage import CompletionUsage

from ..context import RunContext
from ..errors import ContextLimitExceeded, ProviderError
from ..formats import FormatError, to_openai
from ..formats._common import CallNames
from ..formats.openai import read_openai_message
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

__all__ = ["OpenAIChatModel", "openai_error"]

PROVIDER: Final = "openai"
_OWNER: Final = "OpenAIChatModel"
_BUILT: Final = frozenset({"messages", "model", "stream", "tools"})
WEB_SEARCH: Final = "web_search"
"""A ``ServerTool("web_search", {...})`` becomes chat completions' ``web_search_options``."""


def openai_error(exc: openai.OpenAIError) -> ContextLimitExceeded | ProviderError:
    """The tinyctx error for an OpenAI SDK exception (see ``tinyctx.providers._errors``)."""
    if isinstance(exc, openai.APIConnectionError):
        return classify(PROVIDER, kind="connection", message=exc.message)
    if isinstance(exc, openai.APIStatusError):
        return classify(
            PROVIDER,
            kind="status",
            message=exc.message,
            status=exc.status_code,
            headers=exc.response.headers,
            body=exc.body,
        )
    if isinstance(exc, openai.APIError):  # an error event inside a stream
        return classify(PROVIDER, kind="stream", message=exc.message, body={"error": exc.body})
    return ProviderError(f"{PROVIDER}: {type(exc).__name__}: {exc}", provider=PROVIDER)


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _usage(usage: CompletionUsage | None) -> Usage | None:
    if usage is None:
        return None
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    output = usage.completion_tokens_details
    reasoning = (output.reasoning_tokens or 0) if output is not None else 0
    return Usage(usage.prompt_tokens, usage.completion_tokens, cached, reasoning_tokens=reasoning)


def _assistant(
    content: str | None,
    refusal: str | None,
    calls: list[dict[str, Any]],
    reasoning: str | None,
) -> AssistantMessage:
    """The assistant message of a response; a refusal is its text when there is no other,
    and fields beyond chat completions' (a refusal, reasoning) stay in metadata["openai"]."""
    raw: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
    if refusal:
        raw["refusal"] = refusal
        if not content:
            raw["content"] = refusal
    if calls:
        raw["tool_calls"] = _distinct_calls(calls)
    if reasoning:
        raw["reasoning_content"] = reasoning
    try:
        message = read_openai_message(raw, 0, CallNames())
    except FormatError as exc:
        raise unreadable(PROVIDER, exc) from exc
    assert isinstance(message, AssistantMessage)
    return message


def _distinct_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls of one response with each id once: a call repeated whole under its id (some
    servers send one twice) runs once, as other SDKs do; another call under an id the
    response used already is a call of its own, so it runs too, under a fresh id."""
    seen: dict[str, dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    for call in calls:
        first = seen.get(call["id"])
        if first is None:
            seen[call["id"]] = call
        elif first["function"] == call["function"]:
            continue
        else:
            call = {**call, "id": _new_call_id()}
        out.append(call)
    return out


class _StreamState:
    """Assembles a streamed completion and emits its deltas as ModelStreamDelta events."""

    __slots__ = ("calls", "ctx", "finish", "id", "model", "reasoning", "refusal", "text", "usage")

    def __init__(self, ctx: RunContext[Any]) -> None:
        self.ctx = ctx
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage: CompletionUsage | None = None
        self.model: str | None = None
        self.id: str | None = None
        self.finish: list[str] = []

    def handle(self, chunk: ChatCompletionChunk) -> None:
        self.model = chunk.model or self.model
        self.id = chunk.id or self.id
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            if choice.finish_reason:
                self.finish.append(choice.finish_reason)
            delta = choice.delta
            if delta.content:
                self.text.append(delta.content)
                emit_text(self.ctx, delta.content)
            if delta.refusal:
                self.refusal.append(delta.refusal)
                emit_text(self.ctx, delta.refusal)
            reasoning = getattr(delta, "reasoning_content", None)
            if isinstance(reasoning, str):
                self.reasoning.append(reasoning)
                emit_reasoning(self.ctx, reasoning)
            for tool in delta.tool_calls or ():
                function = tool.function
                name = function.name if function is not None else None
                arguments = (function.arguments if function is not None else None) or ""
                # a server that leaves out the index sends each call whole, one per delta
                raw_index = getattr(tool, "index", None)
                index = raw_index if isinstance(raw_index, int) else len(self.calls)
                slot = self.calls.get(index)
                first = slot is None
                if slot is None:
                    slot = self.calls[index] = {"id": "", "name": "", "arguments": []}
                if tool.id and not slot["id"]:
                    slot["id"] = tool.id
                if name and not slot["name"]:
                    slot["name"] = name
                slot["arguments"].append(arguments)
                emit_tool_delta(
                    self.ctx,
                    index,
                    call_id=tool.id if first else None,
                    name=name if first else None,
                    arguments=arguments,
                )

    def response(self, requested_model: str) -> ModelResponse:
        calls = [
            {
                "id": slot["id"] or _new_call_id(),
                "type": "function",
                "function": {"name": slot["name"], "arguments": "".join(slot["arguments"])},
            }
            for _, slot in sorted(self.calls.items())
        ]
        message = _assistant(
            "".join(self.text) or None,
            "".join(self.refusal) or None,
            calls,
            "".join(self.reasoning) or None,
        )
        return ModelResponse(
            message, usage=_usage(self.usage), model=self.model or requested_model, raw=None
        )


class OpenAIChatModel(SDKModel[openai.AsyncOpenAI]):
    """A tinyctx model handler over OpenAI chat completions (``openai.AsyncOpenAI``).

    ``OpenAIChatModel("gpt-4o", client=None, stream=False, **settings)``: ``settings`` are
    keyword arguments of ``client.chat.completions.create`` (``temperature``,
    ``max_completion_tokens``, ``tool_choice``, ``extra_body``...), checked at construction;
    a request's settings (``Agent.settings``, layers) override them per call, and
    ``request.settings["stream"]`` overrides ``stream``. The request's ``model`` wins over
    ``model`` when set. Without a client one is built from ``base_url`` / ``api_key`` or
    the SDK's environment variables, with the SDK's own retries; give a client with
    ``max_retries=0`` when a tinyctx Retry layer does the retrying.

    Each call sends the system prompt first, then the messages (``tinyctx.formats``, API
    mode), the tools as function schemas and the server tools as given
    (``{"type": tool.type, **configuration}``; ``web_search`` becomes
    ``web_search_options``). With ``stream=True`` text and tool-call deltas are emitted as
    :class:`tinyctx.events.ModelStreamDelta` events while the response is assembled; a cancel of
    the run's token stops the read, closes the HTTP response and raises RunCancelled.
    Two tool calls of one response under one id: the same call repeated (name and argument
    text equal) runs once; different calls both run, the later under a fresh ``call_...`` id.
    Errors: ContextLimitExceeded for an overflowing prompt, RetryableProviderError for
    rate limits, overload, server and connection errors, ProviderError otherwise.
    """

    provider = PROVIDER
    provider_name = "openai"
    max_tokens_keys = ("max_completion_tokens", "max_tokens")

    def __init__(
        self,
        model: str,
        client: openai.AsyncOpenAI | None = None,
        *,
        stream: bool = False,
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
        self.settings = check_settings(
            settings, sdk.chat.completions.create, built=_BUILT, owner=_OWNER
        )

    # -- the request ---------------------------------------------------------------------

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments this request becomes for ``chat.completions.create``."""
        settings = self.call_settings(request, self.client.chat.completions.create, built=_BUILT)
        messages: list[dict[str, Any]] = []
        if request.system_prompt:
            messages.append({"role": "system", "content": request.system_prompt})
        messages.extend(to_openai(request.messages, for_api=True))
        params: dict[str, Any] = {"model": request.model or self.model, "messages": messages}
        tools: list[dict[str, Any]] = []
        for spec in request.tools:
            function: dict[str, Any] = {"name": spec.name, "parameters": thaw(spec.parameters)}
            if spec.description:
                function["description"] = spec.description
            tools.append({"type": "function", "function": function})
        for server_tool in request.server_tools:
            if server_tool.type == WEB_SEARCH:
                params["web_search_options"] = thaw(server_tool.configuration)
            else:
                tools.append(server_tool_json(server_tool))
        if tools:
            params["tools"] = tools
        params.update(settings)
        return params

    # -- the call ------------------------------------------------------------------------

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any], /) -> ModelResponse:
        stream = self.streaming(request)
        params = self.request_params(request)
        try:
            if stream:
                return await self._call_streaming(params, ctx)
            with ctx.cancellation.linked_scope("model_call"):
                completion = await self.client.chat.completions.create(**params)
        except openai.OpenAIError as exc:
            raise openai_error(exc) from exc
        response = self._response(completion)
        info = self.call_info(
            params,
            model=str(params["model"]),
            response_id=completion.id,
            finish_reasons=[c.finish_reason for c in completion.choices],
        )
        return response.evolve(info=info)

    def _response(self, completion: ChatCompletion) -> ModelResponse:
        if not completion.choices:
            raise ProviderError(f"{PROVIDER}: the response has no choices", provider=PROVIDER)
        message = completion.choices[0].message
        calls: list[dict[str, Any]] = []
        for call in message.tool_calls or ():
            if call.type != "function":
                raise ProviderError(
                    f"{PROVIDER}: cannot run a {call.type!r} tool call ({call.id}); tinyctx "
                    "tools are functions",
                    provider=PROVIDER,
                )
            calls.append(
                {
                    "id": call.id or _new_call_id(),
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            )
        reasoning = getattr(message, "reasoning_content", None)
        assistant = _assistant(
            message.content,
            message.refusal,
            calls,
            reasoning if isinstance(reasoning, str) else None,
        )
        return ModelResponse(
            assistant, usage=_usage(completion.usage), model=completion.model, raw=completion
        )

    async def _call_streaming(
        self, params: Mapping[str, Any], ctx: RunContext[Any]
    ) -> ModelResponse:
        body = {**params, "stream": True}
        body.setdefault("stream_options", {"include_usage": True})
        state = _StreamState(ctx)
        await consume_stream(
            ctx,
            lambda: self.client.chat.completions.create(**body),
            lambda stream: stream,
            lambda stream: stream.close(),
            state.handle,
        )
        info = self.call_info(
            params, model=str(params["model"]), response_id=state.id, finish_reasons=state.finish
        )
        return state.response(str(params["model"])).evolve(info=info)
