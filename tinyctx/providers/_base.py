"""What both model adapters share: the model name, the SDK client they own or borrow, the
stream switch, settings checked against the SDK method, the streamed read raced against
the run's cancellation token, and stream delta events."""

from __future__ import annotations

import contextlib
import inspect
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar, cast

import anyio

from ..config import flag, implements, text
from ..context import RunContext
from ..errors import ConfigError, ProviderError
from ..events import ModelStreamDelta
from ..formats import FormatError
from ..frozen import thaw
from ..model import CallInfo, ModelRequest
from ..streaming import stream_requested
from ..tools import ServerTool

__all__ = [
    "SDKModel",
    "server_of",
    "unreadable",
    "check_model",
    "check_settings",
    "server_tool_json",
    "consume_stream",
    "emit_text",
    "emit_reasoning",
    "emit_tool_delta",
]

_MERGED = ("extra_headers", "extra_body", "extra_query")
S = TypeVar("S")
E = TypeVar("E")


class _Client(Protocol):
    async def close(self) -> None: ...


ClientT = TypeVar("ClientT")  # an SDK client; SDKModel.aclose awaits its close()


class SDKModel(Generic[ClientT]):
    """Base of the adapters: ``model``, ``client`` (built from ``base_url`` / ``api_key``
    and closed by :meth:`aclose` when the adapter made it), and ``stream``."""

    provider: ClassVar[str] = ""
    provider_name: ClassVar[str] = ""
    """``gen_ai.provider.name`` of the GenAI semantic conventions ("openai", "gcp.gemini")."""
    supports_prefill: ClassVar[bool] = False
    """Whether the API continues a trailing assistant message (prefill); a request a layer
    leaves ending in one is refused before it is sent when False (tinyctx.request_rules)."""
    temperature_key: ClassVar[str] = "temperature"
    max_tokens_keys: ClassVar[tuple[str, ...]] = ("max_tokens",)
    model: str
    server: tuple[str | None, int | None] = (None, None)
    client: ClientT
    stream: bool
    settings: dict[str, Any]
    _owns_client: bool

    def _adopt(
        self,
        model: object,
        client: ClientT | None,
        *,
        stream: object,
        base_url: str | None,
        api_key: str | None,
        client_type: type[ClientT],
        build: Callable[[], ClientT],
        sdk_error: type[Exception],
        credentials: str,
    ) -> ClientT:
        owner = type(self).__name__
        self.model = check_model(model, owner)
        self.stream = flag().check(stream, "stream", owner)
        self._owns_client = client is None
        if client is None:
            try:
                client = build()
            except sdk_error as exc:
                raise ConfigError("client", None, credentials, owner=owner) from exc
        else:
            name = f"{client_type.__module__.split('.')[0]}.{client_type.__name__}"
            implements(client_type, allowed=f"an {name} instance").check(client, "client", owner)
            if base_url is not None or api_key is not None:
                raise ConfigError(
                    "base_url" if base_url is not None else "api_key",
                    base_url if base_url is not None else "***",
                    "None when a client is given (configure the client instead)",
                    owner=owner,
                )
        self.client = client
        self.server = server_of(getattr(client, "base_url", None))
        return client

    def call_info(
        self,
        params: Mapping[str, Any],
        *,
        model: str,
        response_id: str | None = None,
        finish_reasons: Iterable[str | None] = (),
    ) -> CallInfo:
        """What this call was (provider, server, model, temperature, output limit) and
        what the response said of itself, for tracing."""
        temperature = params.get(self.temperature_key)
        max_tokens = next(
            (params[k] for k in self.max_tokens_keys if isinstance(params.get(k), int)), None
        )
        return CallInfo(
            provider=self.provider_name or self.provider,
            request_model=model,
            server_address=self.server[0],
            server_port=self.server[1],
            temperature=float(temperature)
            if isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
            else None,
            max_tokens=max_tokens,
            response_id=response_id or None,
            finish_reasons=tuple(r for r in finish_reasons if r),
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.model!r} stream={self.stream}>"

    async def aclose(self) -> None:
        """Close the HTTP client if this adapter created it."""
        if self._owns_client:
            await cast(_Client, self.client).close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def call_settings(
        self,
        request: ModelRequest,
        method: Callable[..., Any],
        *,
        built: Iterable[str],
        consumed: Iterable[str] = ("stream",),
    ) -> dict[str, Any]:
        """The adapter's settings overridden by the request's (``Agent.settings``, layers),
        less the ``consumed`` ones the adapter reads itself; ``extra_headers``,
        ``extra_body`` and ``extra_query`` of both are merged key by key."""
        skip = set(consumed)
        overrides = {k: v for k, v in request.settings.items() if k not in skip}
        merged = dict(self.settings)
        if overrides:
            checked = check_settings(
                overrides, method, built=built, owner=type(self).__name__, field="request.settings"
            )
            for name in _MERGED:
                # a request's extra headers / body add to the adapter's, key by key
                if isinstance(checked.get(name), dict) and isinstance(merged.get(name), dict):
                    checked[name] = {**merged[name], **checked[name]}
            merged.update(checked)
        return merged

    def streaming(self, request: ModelRequest) -> bool:
        """Whether this call streams: ``request.settings["stream"]``, else True in a
        streamed run (:meth:`tinyctx.Session.stream`), else ``stream``."""
        value = request.settings.get("stream", self.stream or stream_requested())
        streams: bool = flag().check(value, "request.settings['stream']", type(self).__name__)
        return streams


def server_of(url: object) -> tuple[str | None, int | None]:
    """``(host, port)`` of a client's base URL (the scheme's default port when it has
    none); ``(None, None)`` when there is no URL to read."""
    if url is None:
        return None, None
    parsed = urllib.parse.urlsplit(str(url))
    try:
        port = parsed.port
    except ValueError:
        port = None
    if port is None and parsed.scheme in ("http", "https"):
        port = 443 if parsed.scheme == "https" else 80
    return parsed.hostname, port


def unreadable(provider: str, exc: FormatError) -> ProviderError:
    """A response tinyctx cannot read (a tool call of a kind tinyctx cannot run...)."""
    return ProviderError(
        f"{provider}: the response cannot be read: {exc.reason}", provider=provider
    )


def check_model(model: object, owner: str) -> str:
    name: str = text(allowed="a non-empty model name").check(model, "model", owner)
    return name


def check_settings(
    settings: Mapping[str, Any],
    method: Callable[..., Any],
    *,
    built: Iterable[str],
    owner: str,
    field: str = "settings",
) -> dict[str, Any]:
    """``settings`` as keyword arguments for the SDK ``method``; a name the method does not
    take, or one the adapter builds from the request, is a ConfigError naming both."""
    built_set = set(built)
    parameters = inspect.signature(method).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    allowed = sorted(name for name in parameters if name not in built_set and name != "self")
    for name in settings:
        if name in built_set:
            raise ConfigError(
                f"{field}[{name!r}]",
                settings[name],
                f"a setting the adapter does not build from the request ({owner} builds "
                f"{', '.join(sorted(built_set))})",
                owner=owner,
            )
        if not takes_any and name not in parameters:
            raise ConfigError(
                f"{field}[{name!r}]",
                settings[name],
                f"a keyword argument of the SDK call: {', '.join(allowed)}",
                owner=owner,
            )
    return {name: thaw(value) for name, value in settings.items()}


def server_tool_json(tool: ServerTool) -> dict[str, Any]:
    """A provider-hosted tool as both APIs take it: its type and its configuration."""
    return {"type": tool.type, **thaw(tool.configuration)}


async def consume_stream(
    ctx: RunContext[Any],
    open_stream: Callable[[], Awaitable[S]],
    events: Callable[[S], AsyncIterator[E]],
    close: Callable[[S], Awaitable[None]],
    handle: Callable[[E], None],
) -> S:
    """Open a stream and feed each event to ``handle``, raced against ``ctx.cancellation``;
    returns the (closed) stream.

    A cancel drops the rest of the stream and raises RunCancelled (checkpoint
    ``"model_stream"``); whatever ends the read, the stream is closed in a shielded scope,
    so the HTTP response is released even while the task is being cancelled.
    """
    stream: S | None = None
    try:
        with ctx.cancellation.linked_scope("model_stream"):
            stream = await open_stream()
            iterator = events(stream)
            while True:
                try:
                    event = await iterator.__anext__()
                except StopAsyncIteration:
                    break
                handle(event)
                if ctx.cancellation.is_cancelled():
                    break  # cancelled by a subscriber of this event: read nothing more
            ctx.cancellation.raise_if_cancelled("model_stream")
    except BaseException:
        if stream is not None:
            # the failure (or cancel) is what the caller sees; closing must not replace it
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await close(stream)
        raise
    assert stream is not None
    with anyio.CancelScope(shield=True):
        await close(stream)
    return stream


def emit_text(ctx: RunContext[Any], text: str | None) -> None:
    if text:
        ctx.emit(ModelStreamDelta(text=text))


def emit_reasoning(ctx: RunContext[Any], text: str | None) -> None:
    if text:
        ctx.emit(ModelStreamDelta(reasoning=text))


def emit_tool_delta(
    ctx: RunContext[Any],
    index: int,
    *,
    call_id: str | None = None,
    name: str | None = None,
    arguments: str = "",
) -> None:
    ctx.emit(
        ModelStreamDelta(
            tool_call_index=index, tool_call_id=call_id, tool_name=name, arguments_delta=arguments
        )
    )
