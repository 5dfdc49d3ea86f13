"""A connection to an MCP server, kept alive in a task group the application owns.

``async with MCPServerStdio(...) as server:`` starts the server's process (or opens the
HTTP session), runs the MCP handshake and lists its tools before the block's body runs; a
server that cannot be reached fails right there with :class:`MCPConnectError`. Inside the
block one supervisor task keeps the connection: when it is lost (the process died, the
HTTP server went away) it reconnects with exponential backoff, and lists the tools again.
Leaving the block closes the connection (the process is stopped, shielded and bounded by
the SDK) and cancels the supervisor: nothing outlives the block.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

import anyio
import anyio.abc
import httpx2
import mcp.types as mt
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

from ..config import each, implements, number, optional, text
from ..errors import ConfigError, TinyCtxError
from ..events import EventSink
from ._events import MCPConnected, MCPDisconnected, MCPToolSkipped
from ._tool import MCPTool, build_tool

if TYPE_CHECKING:
    from ..context import RunContext

__all__ = ["MCPConnection", "MCPConnectError", "MCPServerError"]

T = TypeVar("T")
_CLIENT_INFO = mt.Implementation(name="tinyctx", version="0.1")


class MCPConnectError(TinyCtxError):
    """The server could not be reached (when the connection is first opened, or while a
    call waited for a reconnection)."""


class MCPServerError(TinyCtxError):
    """A request to the server failed: the connection was lost during it, it timed out,
    or the server answered with a JSON-RPC error. A tool call that fails so becomes an
    error result the model reads; the run goes on."""


class _WatchedDispatcher(JSONRPCDispatcher):
    """The SDK's dispatcher, telling its connection when its receive loop ended."""

    def __init__(self, read: Any, write: Any, on_end: Callable[[], None]) -> None:
        super().__init__(read, write)
        self._on_end = on_end

    async def run(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().run(*args, **kwargs)
        finally:
            self._on_end()


_SECONDS = number(above=0, allowed="a finite number of seconds > 0")
_SECONDS_OR_NONE = optional(_SECONDS, allowed="a finite number of seconds > 0 or None")
_EVENTS = optional(implements(EventSink), allowed="an EventSink or None")


_TOOL_NAMES = optional(
    each(text()), allowed="a collection of non-empty tool names (not one string), or None"
)


def _tool_names(value: Iterable[str] | None, field: str, owner: str) -> frozenset[str] | None:
    """``include``/``exclude`` checked, as a set (a one-pass iterator is read once first)."""
    if isinstance(value, Iterator):
        value = tuple(value)
    names = _TOOL_NAMES.check(value, field, owner)
    return None if names is None else frozenset(names)


class MCPConnection:
    """One MCP server: its connection, its tools and its resources and prompts.

    Settings shared by every transport (all keyword-only, checked here):

    - ``name``: how tinyctx names the server (events, errors, spans); unique among the
      servers of one :class:`~tinyctx.mcp.MCPTools`.
    - ``prefix``: offer each tool as ``{prefix}_{tool}`` (two servers with a ``search``
      each); None offers the server's names as they are.
    - ``include`` / ``exclude``: the server's tool names to offer (None: all) and to
      leave out.
    - ``call_timeout``: seconds a tool call may take before it fails (the SDK sends the
      server a cancellation); None waits as long as the run does.
    - ``connect_timeout``: seconds for the handshake and tool listing.
    - ``reconnect_wait``: seconds a call waits for a lost connection to come back before
      it fails (None: ``connect_timeout``).
    - ``backoff`` / ``max_backoff``: the first wait before reconnecting, doubled after
      each failed attempt up to ``max_backoff``.
    - ``events``: where connection events go (connected, disconnected, tool skipped);
      by default the library's logger.
    """

    transport: ClassVar[str] = ""
    network_transport: ClassVar[str] = ""

    def __init__(
        self,
        *,
        name: str,
        prefix: str | None = None,
        include: Iterable[str] | None = None,
        exclude: Iterable[str] | None = None,
        call_timeout: float | None = 60.0,
        connect_timeout: float = 10.0,
        reconnect_wait: float | None = None,
        backoff: float = 0.1,
        max_backoff: float = 10.0,
        events: EventSink | None = None,
    ) -> None:
        owner = type(self).__name__
        text().check(name, "name", owner)
        optional(text()).check(prefix, "prefix", owner)
        _SECONDS_OR_NONE.check(call_timeout, "call_timeout", owner)
        _SECONDS.check(connect_timeout, "connect_timeout", owner)
        _SECONDS_OR_NONE.check(reconnect_wait, "reconnect_wait", owner)
        _SECONDS.check(backoff, "backoff", owner)
        _SECONDS.check(max_backoff, "max_backoff", owner)
        if max_backoff < backoff:  # the one rule across fields
            raise ConfigError("max_backoff", max_backoff, f">= backoff ({backoff})", owner=owner)
        _EVENTS.check(events, "events", owner)
        self.name = name
        self.prefix = prefix
        self.include = _tool_names(include, "include", owner)
        self.exclude = _tool_names(exclude, "exclude", owner) or frozenset()
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self.reconnect_wait = connect_timeout if reconnect_wait is None else reconnect_wait
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.events = events if events is not None else EventSink()
        self._group: anyio.abc.TaskGroup | None = None
        self._session: ClientSession | None = None
        self._ended: anyio.Event | None = None
        self._ready = anyio.Event()
        self._tools: tuple[MCPTool, ...] = ()
        self._listing: tuple[tuple[str, str, str], ...] = ()
        self._skipped: tuple[tuple[str, str], ...] = ()
        self._generation = 0
        self._stale = False
        self._failure: str | None = None
        self._closed = False
        self.protocol_version: str | None = None
        """The protocol version the server agreed to (None until connected)."""
        self.session_id: str | None = None
        """The HTTP session id the server gave (None over stdio)."""
        self.server_info: mt.Implementation | None = None
        self._attribute_items: (
            tuple[tuple[str | None, str | None], tuple[tuple[str, str | int], ...]] | None
        ) = None

    def __repr__(self) -> str:
        state = "connected" if self._session is not None else "not connected"
        return f"<{type(self).__name__} {self.name!r} {state}, {len(self._tools)} tools>"

    # -- what subclasses give ------------------------------------------------------------

    def _transport(self) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        raise NotImplementedError

    def span_attribute_items(self) -> tuple[tuple[str, str | int], ...]:
        """:meth:`span_attributes` as sorted pairs, made once per connection."""
        key = (self.protocol_version, self.session_id)
        cached = self._attribute_items
        if cached is None or cached[0] != key:
            cached = self._attribute_items = (key, tuple(sorted(self.span_attributes().items())))
        return cached[1]

    def span_attributes(self) -> dict[str, str | int]:
        """The OpenTelemetry attributes of a call to this server (GenAI MCP conventions)."""
        attributes: dict[str, str | int] = {"network.transport": self.network_transport}
        if self.protocol_version is not None:
            attributes["mcp.protocol.version"] = self.protocol_version
        if self.session_id is not None:
            attributes["mcp.session.id"] = self.session_id
        return attributes

    # -- tools ---------------------------------------------------------------------------

    def exposed_name(self, remote: str) -> str:
        """The name the model sees for the server's tool ``remote``."""
        return f"{self.prefix}_{remote}" if self.prefix is not None else remote

    @property
    def tools(self) -> tuple[MCPTool, ...]:
        """The server's tools as last listed (filtered, prefixed, malformed ones left out)."""
        return self._tools

    @property
    def generation(self) -> int:
        """Grows each time the listed tools change."""
        return self._generation

    @property
    def skipped(self) -> tuple[tuple[str, str], ...]:
        """``(tool, why)`` for each tool of the last listing that is not offered."""
        return self._skipped

    @property
    def tools_stale(self) -> bool:
        """True when the server said its tool list changed and it was not listed since."""
        return self._stale

    def mark_stale(self) -> None:
        """List the tools again before the next model call (what a list_changed does)."""
        self._stale = True

    @property
    def connected(self) -> bool:
        return self._session is not None

    @property
    def opened(self) -> bool:
        """True inside ``async with server:``."""
        return self._group is not None and not self._closed

    @property
    def client_session(self) -> ClientSession | None:
        """The SDK's session of the live connection, for what tinyctx does not wrap
        (None while disconnected; a reconnection brings a new one)."""
        return self._session

    def _offered(self, remote: str) -> bool:
        if remote in self.exclude:
            return False
        return self.include is None or remote in self.include

    async def _list_tools(self, session: ClientSession) -> None:
        remote: list[mt.Tool] = []
        cursor: str | None = None
        for _ in range(1000):  # a server that pages forever cannot hang the connection
            params = mt.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            remote.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        self._adopt(remote)

    def _adopt(self, remote: Sequence[mt.Tool]) -> None:
        offered = [t for t in remote if self._offered(t.name)]
        listing = tuple(
            (t.name, t.description or "", json.dumps(t.input_schema, sort_keys=True, default=str))
            for t in offered
        )
        if listing == self._listing and self._generation:
            return  # unchanged (a reconnection, a notification that changed nothing)
        generation = self._generation + 1
        tools: list[MCPTool] = []
        skipped: list[tuple[str, str]] = []
        seen: set[str] = set()
        for t in offered:
            built = build_tool(self, t, generation)
            if isinstance(built, str):
                skipped.append((t.name, built))
            elif built.name in seen:
                skipped.append((t.name, "the server lists a tool of this name twice"))
            else:
                seen.add(built.name)
                tools.append(built)
        for tool_name, why in skipped:
            self.events.emit(MCPToolSkipped(server=self.name, tool=tool_name, reason=why))
        self._tools, self._skipped = tuple(tools), tuple(skipped)
        self._listing, self._generation = listing, generation

    async def refresh_tools(self) -> bool:
        """List the server's tools again now; True when they changed."""
        before = self._generation
        self._stale = False
        await self._request(self._list_tools, None, "tools/list")
        return self._generation != before

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mt.ToolListChangedNotification):
            self.mark_stale()

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._group is not None:
            raise RuntimeError(f"MCP server {self.name!r} is already open")
        self._closed = False
        group = anyio.create_task_group()
        await group.__aenter__()
        try:
            await group.start(self._supervise, name=f"tinyctx.mcp[{self.name}]")
        except BaseException:
            # the supervisor has ended; the group holds nothing else, and must not wrap
            # the caller's error in an ExceptionGroup
            group.cancel_scope.cancel()
            group.cancel_scope.shield = True  # its own scope: a new one would break LIFO exit
            await group.__aexit__(None, None, None)
            raise
        self._group = group
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        group = self._group
        assert group is not None
        self._closed = True
        self._group = None
        group.cancel_scope.cancel()
        await group.__aexit__(None, None, None)
        self._ready.set()  # a call still waiting learns the server is closed

    async def _supervise(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        delay, attempt, started = self.backoff, 0, False
        while True:
            attempt += 1
            error: str | None = None
            try:
                async with AsyncExitStack() as stack:
                    ended = await self._connect(stack)
                    self._failure = None
                    self.events.emit(
                        MCPConnected(
                            server=self.name,
                            transport=self.transport,
                            protocol_version=self.protocol_version or "",
                            tools=tuple(t.name for t in self._tools),
                            attempt=attempt,
                        )
                    )
                    if not started:
                        started = True
                        task_status.started()
                    delay, attempt = self.backoff, 0
                    await ended.wait()
                    error = "the connection was lost"
            except Exception as exc:
                error = _describe(exc)
                if not started:
                    raise MCPConnectError(
                        f"cannot connect to MCP server {self.name!r} ({self.transport}): {error}"
                    ) from exc
            finally:
                if self._ended is not None:
                    self._drop(self._ended)
            self._failure = error
            self.events.emit(MCPDisconnected(server=self.name, error=error or "", retry_in=delay))
            await anyio.sleep(delay)
            delay = min(delay * 2, self.max_backoff)

    async def _connect(self, stack: AsyncExitStack) -> anyio.Event:
        read, write = await stack.enter_async_context(self._transport())
        ended = anyio.Event()
        session = ClientSession(
            dispatcher=_WatchedDispatcher(read, write, lambda: self._drop(ended)),
            message_handler=self._on_message,
            client_info=_CLIENT_INFO,
        )
        await stack.enter_async_context(session)
        with anyio.fail_after(self.connect_timeout):
            init = await session.initialize()
            await self._list_tools(session)
        self.protocol_version = str(init.protocol_version)
        self.server_info = init.server_info
        self._stale = False
        self._session, self._ended = session, ended
        self._ready.set()
        return ended

    def _lost(self, session: ClientSession) -> None:
        """A request found the connection dead: reconnect (once per connection)."""
        if self._session is session and self._ended is not None:
            self._drop(self._ended)

    def _drop(self, ended: anyio.Event) -> None:
        """The connection whose end is ``ended`` is gone: no call may take it any more
        (they wait for the next one), and its supervisor reconnects."""
        ended.set()
        if self._ended is ended:
            self._session, self._ended = None, None
            if self._ready.is_set():
                self._ready = anyio.Event()

    async def _session_now(self) -> ClientSession:
        session = self._session
        if session is not None:
            return session
        if self._closed or self._group is None:
            raise MCPConnectError(
                f"MCP server {self.name!r} is not open: use it inside `async with server:`"
            )
        with anyio.move_on_after(self.reconnect_wait):
            while self._session is None and not self._closed:
                await self._ready.wait()
        session = self._session
        if session is None:
            why = f": {self._failure}" if self._failure else ""
            raise MCPConnectError(
                f"MCP server {self.name!r} is not connected (reconnecting{why}); "
                f"waited {self.reconnect_wait:g}s"
            )
        return session

    async def _request(
        self,
        fn: Callable[[ClientSession], Awaitable[T]],
        ctx: RunContext[Any] | None,
        method: str,
    ) -> T:
        """``fn(session)`` on the live connection (waiting for a reconnection if there is
        none), raced against the run's cancellation: a cancelled run cancels the request
        (the SDK tells the server). A lost connection or an error answer raises
        :class:`MCPServerError`."""
        session = await self._session_now()
        try:
            if ctx is None:
                return await fn(session)
            with ctx.cancellation.linked_scope("in_tool"):
                return await fn(session)
            raise AssertionError("unreachable")  # pragma: no cover - linked_scope raised
        except MCPError as exc:
            if exc.code == mt.CONNECTION_CLOSED:
                self._lost(session)
                raise MCPServerError(
                    f"MCP server {self.name!r} closed the connection during {method} "
                    "(it is being reconnected)"
                ) from exc
            if exc.code == mt.REQUEST_TIMEOUT:
                raise MCPServerError(
                    f"MCP server {self.name!r} did not answer {method} in time ({exc.message})"
                ) from exc
            raise MCPServerError(
                f"MCP server {self.name!r} answered {method} with error {exc.code}: {exc.message}"
            ) from exc
        except (httpx2.HTTPError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._lost(session)
            raise MCPServerError(
                f"MCP server {self.name!r}: the connection failed during {method}: "
                f"{_describe(exc)} (it is being reconnected)"
            ) from exc

    # -- calls ---------------------------------------------------------------------------

    async def call_tool(
        self, name: str, arguments: dict[str, Any], ctx: RunContext[Any] | None = None
    ) -> mt.CallToolResult:
        """Call the server's tool ``name`` (its own name, not the prefixed one)."""
        timeout = self.call_timeout

        async def call(session: ClientSession) -> mt.CallToolResult:
            result = await session.call_tool(name, arguments, read_timeout_seconds=timeout)
            assert isinstance(result, mt.CallToolResult)
            return result

        return await self._request(call, ctx, "tools/call")

    async def list_resources(self, ctx: RunContext[Any] | None = None) -> tuple[mt.Resource, ...]:
        """The server's resources (every page)."""

        async def listing(session: ClientSession) -> tuple[mt.Resource, ...]:
            found: list[mt.Resource] = []
            cursor: str | None = None
            for _ in range(1000):
                params = mt.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await session.list_resources(params=params)
                found.extend(page.resources)
                cursor = page.next_cursor
                if not cursor:
                    break
            return tuple(found)

        return await self._request(listing, ctx, "resources/list")

    async def read_resource(
        self, uri: str, ctx: RunContext[Any] | None = None
    ) -> mt.ReadResourceResult:
        """The contents of resource ``uri`` (see :func:`~tinyctx.mcp.read_resource` for
        them as content parts)."""

        async def read(session: ClientSession) -> mt.ReadResourceResult:
            return await session.read_resource(uri)

        return await self._request(read, ctx, "resources/read")

    async def list_prompts(self, ctx: RunContext[Any] | None = None) -> tuple[mt.Prompt, ...]:
        """The server's prompts (every page)."""

        async def listing(session: ClientSession) -> tuple[mt.Prompt, ...]:
            found: list[mt.Prompt] = []
            cursor: str | None = None
            for _ in range(1000):
                params = mt.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await session.list_prompts(params=params)
                found.extend(page.prompts)
                cursor = page.next_cursor
                if not cursor:
                    break
            return tuple(found)

        return await self._request(listing, ctx, "prompts/list")

    async def get_prompt(
        self,
        name: str,
        arguments: Mapping[str, str] | None = None,
        ctx: RunContext[Any] | None = None,
    ) -> mt.GetPromptResult:
        """Prompt ``name`` filled with ``arguments`` (see :func:`~tinyctx.mcp.get_prompt`
        for it as tinyctx messages)."""

        async def get(session: ClientSession) -> mt.GetPromptResult:
            return await session.get_prompt(name, dict(arguments or {}))

        return await self._request(get, ctx, "prompts/get")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe(exc.exceptions[0])
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
