"""The two transports: a server run as a subprocess (stdio) and one over streamable HTTP."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx2
from mcp import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from ..config import Check, each, text
from ._connection import MCPConnection


def _http_url(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        parts = urlsplit(value)
    except ValueError:  # a malformed netloc, such as an unclosed IPv6 bracket
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


_URL: Check[str] = Check(_http_url, "an http:// or https:// URL")
_ARGS = each(text(empty=True), allowed="a sequence of strings")

__all__ = ["MCPServerStdio", "MCPServerHTTP"]


class MCPServerStdio(MCPConnection):
    """An MCP server run as a subprocess, spoken to over its stdin and stdout.

    ``MCPServerStdio("python", ["server.py"], name="files")``: the process starts when
    the connection opens (``async with``) and is stopped when it closes; a process that
    dies is started again (backoff). ``env`` is added to the SDK's default environment
    (a few variables such as ``PATH`` and ``HOME``, not this process's whole
    environment: pass what the server needs, API keys too); the server's stderr goes to
    ``errlog`` (this process's stderr by default).
    """

    transport = "stdio"
    network_transport = "pipe"

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        errlog: Any = None,
        name: str | None = None,
        **options: Any,
    ) -> None:
        text().check(command, "command", "MCPServerStdio")
        _ARGS.check(args, "args", "MCPServerStdio")
        super().__init__(name=name or command.rsplit("/", 1)[-1], **options)
        self.params = StdioServerParameters(
            command=command, args=list(args), env=dict(env) if env else None, cwd=cwd
        )
        self.errlog = errlog

    def _transport(self) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        return stdio_client(self.params, errlog=self.errlog or sys.stderr)


class MCPServerHTTP(MCPConnection):
    """An MCP server over streamable HTTP: ``MCPServerHTTP("http://127.0.0.1:8000/mcp")``.

    ``headers`` go with every request (authorization); a lost session (the server
    restarted) is opened again (backoff).
    """

    transport = "streamable-http"
    network_transport = "tcp"

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        **options: Any,
    ) -> None:
        _URL.check(url, "url", "MCPServerHTTP")
        parts = urlsplit(url)
        host = str(parts.hostname)  # _URL checked there is one
        super().__init__(name=name or host, **options)
        self.url = url
        self.headers = dict(headers or {})
        self._address = (host, parts.port or (443 if parts.scheme == "https" else 80))

    def span_attributes(self) -> dict[str, str | int]:
        attributes = super().span_attributes()
        attributes["network.protocol.name"] = "http"
        attributes["server.address"], attributes["server.port"] = self._address
        return attributes

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[tuple[Any, Any]]:
        self.session_id = None

        async def remember_session(response: httpx2.Response) -> None:
            session_id = response.headers.get("mcp-session-id")
            if session_id:
                self.session_id = session_id

        client = httpx2.AsyncClient(
            headers=self.headers,
            timeout=httpx2.Timeout(30.0, read=300.0),
            event_hooks={"response": [remember_session]},
        )
        async with client, streamable_http_client(self.url, http_client=client) as streams:
            yield streams

    def _transport(self) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        return self._open()
