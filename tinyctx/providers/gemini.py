"""A model handler over Google's ``google-genai`` SDK (``pip install 'tinyctx[gemini]'``).

``GeminiModel("gemini-2.5-flash")`` calls ``client.aio.models.generate_content`` (or
``generate_content_stream``) of a ``google.genai.Client``. The contents encoding is in
:mod:`tinyctx.providers._gemini_contents`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextvars import ContextVar
from typing import Any, Final

try:
    import httpx2
    from google import genai
    from google.genai import errors as genai_errors
    from google.genai import types
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tinyctx.providers.gemini needs the google-genai SDK: pip install 'tinyctx[gemini]'"
    ) from exc

from ..context import RunContext
from ..errors import ConfigError, ContextLimitExceeded, ProviderError
from ..formats import FormatError
from ..frozen import thaw
from ..model import ModelRequest, ModelResponse, Usage
from ..tokens import REASONING_TOKENS
from ._base import (
    SDKModel,
    consume_stream,
    emit_reasoning,
    emit_text,
    emit_tool_delta,
    unreadable,
)
from ._errors import classify
from ._gemini_contents import GEMINI, assistant_from_parts, system_text, to_gemini_contents

__all__ = ["GeminiModel", "gemini_error"]

PROVIDER: Final = "gemini"
_OWNER: Final = "GeminiModel"
_BUILT: Final = frozenset({"system_instruction", "tools"})
_CONFIG_FIELDS: Final = frozenset(types.GenerateContentConfig.model_fields)


def gemini_error(exc: Exception) -> ContextLimitExceeded | ProviderError:
    """The tinyctx error for a google-genai SDK exception (an HTTP error status) or a
    transport failure of its HTTP client (see ``tinyctx.providers._errors``)."""
    if isinstance(exc, genai_errors.APIError):
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
        details = exc.details if isinstance(exc.details, Mapping) else None
        body = details if details is not None else {"error": {"message": exc.message}}
        error = body.get("error") if isinstance(body.get("error"), Mapping) else body
        if isinstance(error, Mapping) and error.get("status"):
            # Gemini's kind of error is its status (RESOURCE_EXHAUSTED...), its code the HTTP one
            body = {"error": {**error, "type": str(error["status"]).lower()}}
        return classify(
            PROVIDER,
            kind="status",
            message=exc.message or str(exc),
            status=exc.code,
            headers=dict(headers) if headers is not None else None,
            body=body,
        )
    if isinstance(exc, httpx2.TransportError):
        return classify(PROVIDER, kind="connection", message=f"{type(exc).__name__}: {exc}")
    return ProviderError(f"{PROVIDER}: {type(exc).__name__}: {exc}", provider=PROVIDER)


_OPENED: ContextVar[list[Any] | None] = ContextVar("tinyctx_gemini_opened", default=None)


async def _record(response: Any) -> None:
    """httpx2 response hook: note the responses a streamed call opens, so a cancel can
    close the HTTP response (closing the SDK's generator chain does not reach it)."""
    opened = _OPENED.get()
    if opened is not None:
        opened.append(response)


def _watch(client: genai.Client) -> None:
    http = _http_client(client)
    hooks = getattr(http, "event_hooks", None)
    if isinstance(hooks, Mapping) and _record not in hooks.get("response", ()):
        http.event_hooks = {**hooks, "response": [*hooks.get("response", ()), _record]}


def _usage(metadata: types.GenerateContentResponseUsageMetadata | None) -> Usage | None:
    """Gemini counts thoughts apart from the candidates; tinyctx's output is both, and
    its input the whole prompt (cached content and tool-use prompts included)."""
    if metadata is None:
        return None
    thoughts = metadata.thoughts_token_count or 0
    prompt = (metadata.prompt_token_count or 0) + (metadata.tool_use_prompt_token_count or 0)
    return Usage(
        prompt,
        (metadata.candidates_token_count or 0) + thoughts,
        metadata.cached_content_token_count or 0,
        reasoning_tokens=thoughts,
    )


def _client(api_key: str | None, base_url: str | None) -> genai.Client:
    """A client on its own httpx2 client, which runs under trio as under asyncio (the SDK's
    default async transport keeps one pool per asyncio loop and needs asyncio)."""
    options = types.HttpOptions(base_url=base_url, httpx_async_client=httpx2.AsyncClient())
    return genai.Client(api_key=api_key, http_options=options)


def _http_client(client: genai.Client) -> Any:
    options = getattr(client._api_client, "_http_options", None)  # the SDK keeps it there
    return getattr(options, "httpx_async_client", None)


class _Stream:
    """Chunks of a streamed answer: deltas emitted, parts and the last metadata kept."""

    __slots__ = ("calls", "ctx", "last", "parts")

    def __init__(self, ctx: RunContext[Any]) -> None:
        self.ctx = ctx
        self.parts: list[dict[str, Any]] = []
        self.calls = 0
        self.last: types.GenerateContentResponse | None = None

    def handle(self, chunk: types.GenerateContentResponse) -> None:
        self.last = chunk
        for part in _candidate_parts(chunk):
            call = part.get("function_call")
            if isinstance(call, Mapping):
                arguments = json.dumps(call.get("args") or {}, ensure_ascii=False)
                emit_tool_delta(
                    self.ctx,
                    self.calls,
                    call_id=call.get("id"),
                    name=call.get("name"),
                    arguments=arguments,
                )
                self.calls += 1
            elif isinstance(part.get("text"), str):
                if part.get("thought"):
                    emit_reasoning(self.ctx, part["text"])  # a thought summary
                else:
                    emit_text(self.ctx, part["text"])
            previous = self.parts[-1] if self.parts else None
            if (
                previous is not None
                and set(part) <= {"text", "thought"}
                and set(previous) <= {"text", "thought"}
                and "text" in part
                and "text" in previous
                and bool(part.get("thought")) == bool(previous.get("thought"))
            ):
                previous["text"] += part["text"]  # one text part, as a whole answer has it
            else:
                self.parts.append(dict(part))


def _candidate_parts(response: types.GenerateContentResponse) -> list[dict[str, Any]]:
    candidates = response.candidates or ()
    content = candidates[0].content if candidates else None
    parts = content.parts if content is not None else None
    return [p.model_dump(mode="json", exclude_none=True) for p in parts or ()]


class GeminiModel(SDKModel[genai.Client]):
    """A tinyctx model handler over the Gemini API (``google.genai.Client``).

    ``GeminiModel("gemini-2.5-flash", client=None, stream=False, **config)``: ``config``
    are fields of ``types.GenerateContentConfig`` (``temperature``,
    ``max_output_tokens``, ``thinking_config``, ``safety_settings``...), checked at
    construction; a request's settings override them per call. Without a client one is
    built from ``api_key`` (or the SDK's ``GEMINI_API_KEY``) and ``base_url`` on an httpx2
    client; a client you give should have ``httpx_async_client`` set in its
    ``http_options`` to run under trio.

    The system prompt and the thread's system messages become ``system_instruction``;
    the messages become contents (:mod:`tinyctx.providers._gemini_contents`); tools
    become function declarations (``parameters_json_schema``), and server tools go as
    Gemini tools (``ServerTool("google_search")`` is ``{"google_search": {}}``). The
    model's parts (thoughts and their signatures) stay with its message and go back
    with it. Streaming, cancellation and errors behave as for the other adapters
    (429 ``RESOURCE_EXHAUSTED`` and 5xx are retryable).
    """

    provider = PROVIDER
    provider_name = "gcp.gemini"
    max_tokens_keys = ("max_output_tokens",)

    def __init__(
        self,
        model: str,
        client: genai.Client | None = None,
        *,
        stream: bool = False,
        base_url: str | None = None,
        api_key: str | None = None,
        **config: Any,
    ) -> None:
        self._adopt(
            model,
            client,
            stream=stream,
            base_url=base_url,
            api_key=api_key,
            client_type=genai.Client,
            build=lambda: _client(api_key, base_url),
            sdk_error=Exception,
            credentials="a google.genai.Client, or api_key= / GEMINI_API_KEY",
        )
        self.server = _server(self.client)
        _watch(self.client)
        self.settings = self._check(config, "settings")

    async def aclose(self) -> None:
        """Close the client (and the httpx2 client under it) if this adapter made it."""
        if self._owns_client:
            await self.client.aio.aclose()
            http = _http_client(self.client)
            if http is not None:
                await http.aclose()

    def _check(self, config: Mapping[str, Any], field: str) -> dict[str, Any]:
        for name in config:
            if name in _BUILT or name not in _CONFIG_FIELDS:
                allowed = ", ".join(sorted(_CONFIG_FIELDS - _BUILT - {"http_options"}))
                raise ConfigError(
                    f"{field}[{name!r}]",
                    config[name],
                    f"a GenerateContentConfig field the adapter does not build: {allowed}",
                    owner=_OWNER,
                )
        return {name: thaw(value) for name, value in config.items()}

    # -- the request ---------------------------------------------------------------------

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """``model``, ``contents`` and ``config`` (as plain JSON) of this request."""
        overrides = {k: v for k, v in request.settings.items() if k != "stream"}
        config = {**self.settings, **self._check(overrides, "request.settings")}
        try:
            contents = to_gemini_contents(request.messages)
        except FormatError as exc:
            raise ConfigError(
                f"request.messages[{exc.index}]", None, exc.reason, owner=_OWNER
            ) from exc
        system = system_text(request.messages, request.system_prompt)
        if system:
            config["system_instruction"] = system
        tools: list[dict[str, Any]] = []
        declarations = []
        for spec in request.tools:
            declaration: dict[str, Any] = {
                "name": spec.name,
                "parameters_json_schema": thaw(spec.parameters),
            }
            if spec.description:
                declaration["description"] = spec.description
            declarations.append(declaration)
        if declarations:
            tools.append({"function_declarations": declarations})
        tools += [{tool.type: thaw(tool.configuration)} for tool in request.server_tools]
        if tools:
            config["tools"] = tools
        return {"model": request.model or self.model, "contents": contents, "config": config}

    # -- the call ------------------------------------------------------------------------

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any], /) -> ModelResponse:
        stream = self.streaming(request)
        params = self.request_params(request)
        try:
            contents = [types.Content.model_validate(c) for c in params["contents"]]
            config = types.GenerateContentConfig.model_validate(params["config"])
        except ValueError as exc:
            raise ConfigError(
                "request", None, f"a valid Gemini request ({exc})", owner=_OWNER
            ) from exc
        models = self.client.aio.models
        try:
            if stream:
                state = _Stream(ctx)

                async def open_stream() -> AsyncIterator[types.GenerateContentResponse]:
                    return await models.generate_content_stream(
                        model=params["model"], contents=contents, config=config
                    )

                opened: list[Any] = []

                async def close(stream: AsyncIterator[types.GenerateContentResponse]) -> None:
                    await _aclose(stream)
                    for response in opened:
                        await response.aclose()

                token = _OPENED.set(opened)
                try:
                    await consume_stream(ctx, open_stream, lambda s: s, close, state.handle)
                finally:
                    _OPENED.reset(token)
                if state.last is None:
                    raise ProviderError(f"{PROVIDER}: the stream sent nothing", provider=PROVIDER)
                return self._response(state.last, state.parts, params)
            with ctx.cancellation.linked_scope("model_call"):
                answer = await models.generate_content(
                    model=params["model"], contents=contents, config=config
                )
        except (genai_errors.APIError, httpx2.TransportError) as exc:
            raise gemini_error(exc) from exc
        return self._response(answer, _candidate_parts(answer), params)

    def _response(
        self,
        answer: types.GenerateContentResponse,
        parts: list[dict[str, Any]],
        params: Mapping[str, Any],
    ) -> ModelResponse:
        candidates = answer.candidates or ()
        if not candidates and answer.prompt_feedback is not None:
            reason = answer.prompt_feedback.block_reason
            raise ProviderError(f"{PROVIDER}: the prompt was blocked ({reason})", provider=PROVIDER)
        try:
            message = assistant_from_parts(parts)
        except (FormatError, TypeError, ValueError) as exc:
            error = exc if isinstance(exc, FormatError) else FormatError(str(exc), format=GEMINI)
            raise unreadable(PROVIDER, error) from exc
        usage = _usage(answer.usage_metadata)
        thinking = any(p.get("thought_signature") or p.get("thought") for p in parts)
        if usage is not None and usage.reasoning_tokens and thinking:
            metadata = {**message.metadata, "tinyctx": {REASONING_TOKENS: usage.reasoning_tokens}}
            message = message.evolve(metadata=metadata)
        finish = [c.finish_reason.value if c.finish_reason else None for c in candidates]
        info = self.call_info(
            params["config"],
            model=str(params["model"]),
            response_id=answer.response_id,
            finish_reasons=finish,
        )
        return ModelResponse(
            message, usage=usage, model=answer.model_version or None, raw=answer, info=info
        )


async def _aclose(stream: AsyncIterator[types.GenerateContentResponse]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


def _server(client: genai.Client) -> tuple[str | None, int | None]:
    from ._base import server_of

    options = getattr(client._api_client, "_http_options", None)  # the SDK keeps it there
    url = getattr(options, "base_url", None) or "https://generativelanguage.googleapis.com/"
    return server_of(url)
