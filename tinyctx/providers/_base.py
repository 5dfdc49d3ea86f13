"""What both model adapters share: settings checked against the SDK method, the streamed
read raced against the run's cancellation token, and stream delta events."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import anyio

from ..context import RunContext
from ..errors import ConfigError
from ..events import ModelStreamDelta
from ..frozen import thaw

__all__ = [
    "check_model",
    "check_settings",
    "request_settings",
    "consume_stream",
    "emit_text",
    "emit_tool_delta",
]

S = TypeVar("S")
E = TypeVar("E")


def check_model(model: object, owner: str) -> str:
    if not isinstance(model, str) or not model:
        raise ConfigError("model", model, "a non-empty model name", owner=owner)
    return model


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


def request_settings(
    defaults: Mapping[str, Any],
    request_settings: Mapping[str, Any],
    method: Callable[..., Any],
    *,
    built: Iterable[str],
    owner: str,
) -> dict[str, Any]:
    """The adapter's settings overridden by the request's (``Agent.settings``, layers)."""
    if not request_settings:
        return dict(defaults)
    merged = dict(defaults)
    merged.update(
        check_settings(request_settings, method, built=built, owner=owner, field="request.settings")
    )
    return merged


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
