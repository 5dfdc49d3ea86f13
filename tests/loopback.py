"""A scripted HTTP/1.1 server on 127.0.0.1, for driving the real OpenAI and Anthropic SDK
clients in tests without any network.

The server runs in its own thread, so it works under every async backend (trio, asyncio)
and never shares an event loop with the client under test. A test queues replies (JSON
bodies, error statuses with headers, SSE streams, streams held open until the client
hangs up, dropped connections) and reads back every request the client sent. The last
part of the module writes each API's wire format (JSON and SSE events) for the replies.
"""

from __future__ import annotations

import json
import select
import socket
import ssl
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import anyio
import openai

from tinyctx import RunCancelled, Session

__all__ = [
    "TRIO_ASYNCGEN_WARNING",
    "LoopbackServer",
    "Recorded",
    "Reply",
    "json_reply",
    "sse_reply",
    "error_reply",
    "drop_connection",
    "hang_up_on_client",
    "loopback_server",
    "run_cancelled_once_sent",
    "openai_client",
    "anthropic_client",
    "openai_completion",
    "openai_stream",
    "openai_error_body",
    "anthropic_message",
    "anthropic_stream",
    "anthropic_error_body",
]

_WAIT_LIMIT = 30.0  # seconds a held stream waits for the client before giving up

TRIO_ASYNCGEN_WARNING = (
    r"ignore:Async generator '(openai|anthropic|httpx2|httpcore2)\.[^']*' was garbage "
    r"collected before it had been exhausted:ResourceWarning"
)
"""A filterwarnings entry for what trio reports when an SDK stream is left unexhausted."""


@dataclass(frozen=True)
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    """One scripted response: a body, or SSE frames written one chunk at a time."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    events: Sequence[bytes] | None = None
    hold: bool = False
    """After the events, keep the stream open until the client closes the connection."""
    drop: bool = False
    """Close the connection without answering."""
    hang: bool = False
    """Answer nothing; wait until the client closes the connection."""


def json_reply(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, dict(headers or {}), json.dumps(payload).encode())


def error_reply(payload: Any, status: int, headers: dict[str, str] | None = None) -> Reply:
    return json_reply(payload, status, headers)


def drop_connection() -> Reply:
    return Reply(drop=True)


def hang_up_on_client() -> Reply:
    """Never answer: the request hangs until the client gives up (cancel, timeout)."""
    return Reply(hang=True)


def _frame(event: str | None, data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def sse_reply(
    events: Iterable[tuple[str | None, Any]],
    *,
    hold: bool = False,
    headers: dict[str, str] | None = None,
) -> Reply:
    """An ``text/event-stream`` reply of ``(event name or None, data)`` pairs."""
    return Reply(
        200, dict(headers or {}), events=[_frame(name, data) for name, data in events], hold=hold
    )


class LoopbackServer:
    """``with LoopbackServer() as server:`` serves ``server.url`` until the block ends.

    ``server.add(reply, ...)`` queues replies answered in order; ``server.requests`` lists
    what arrived; ``await server.wait_client_closed()`` returns once a held stream saw its
    client hang up. A request with no reply left gets a 500 and is noted in
    ``server.unexpected`` (a test should assert it is empty).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._script: list[Reply] = []
        self.requests: list[Recorded] = []
        self.unexpected: list[str] = []
        self.client_closed = threading.Event()
        self.request_arrived = threading.Event()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> LoopbackServer:
        handler = type("Handler", (_Handler,), {"owner": self})
        server = _Server(("127.0.0.1", 0), handler)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.01,), name="loopback", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    @property
    def url(self) -> str:
        assert self._server is not None, "use the server inside `with LoopbackServer():`"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- script --------------------------------------------------------------------------

    def add(self, *replies: Reply) -> LoopbackServer:
        with self._lock:
            self._script.extend(replies)
        return self

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._script)

    def _next(self, recorded: Recorded) -> Reply | None:
        with self._lock:
            self.requests.append(recorded)
            self.request_arrived.set()
            if self._script:
                return self._script.pop(0)
            self.unexpected.append(f"{recorded.method} {recorded.path}")
            return None

    async def wait_client_closed(self) -> bool:
        """Wait (in a worker thread, at most 30 s) until a held stream saw its client close."""
        return await anyio.to_thread.run_sync(self.client_closed.wait, _WAIT_LIMIT)

    async def wait_request(self) -> bool:
        """Wait (in a worker thread, at most 30 s) until a request arrived."""
        return await anyio.to_thread.run_sync(self.request_arrived.wait, _WAIT_LIMIT)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            return  # a client that hangs up mid-reply: what the cancel tests do on purpose
        owner: LoopbackServer = self.RequestHandlerClass.owner  # type: ignore[attr-defined]
        owner.unexpected.append(f"server error: {error!r}")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small writes go out at once (no delayed-ACK stalls)
    owner: LoopbackServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        recorded = Recorded(
            self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
        )
        reply = self.owner._next(recorded)
        if reply is None:
            self._send_body(500, {}, b'{"error": {"message": "loopback script exhausted"}}')
            return
        if reply.drop:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if reply.hang:
            self._wait_for_hangup()
            self.close_connection = True
            return
        if reply.events is None:
            self._send_body(reply.status, reply.headers, reply.body)
            return
        self.send_response(reply.status)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            for frame in reply.events:
                self.wfile.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # the client hung up before the last frame went out (a cancel on an early delta
            # while this thread, slow under load, was still writing): that is the close too
            self.owner.client_closed.set()
            self.close_connection = True
            return
        if reply.hold:
            self._wait_for_hangup()
            self.close_connection = True
            return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _send_body(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def _wait_for_hangup(self) -> None:
        """Block until the client closes the connection (reading it returns EOF)."""
        owner = self.owner
        waited = 0.0
        while not owner._stopping.is_set() and waited < _WAIT_LIMIT:
            readable, _, _ = select.select([self.connection], [], [], 0.05)
            waited += 0.05
            if not readable:
                continue
            try:
                data = self.connection.recv(1024)
            except OSError:
                data = b""
            if not data:
                owner.client_closed.set()
                return


async def run_cancelled_once_sent(
    session: Session[Any], server: LoopbackServer, text: str
) -> RunCancelled:
    """Run ``text`` in ``session`` and cancel it once its request reached ``server``; the
    RunCancelled the run ended with (the test fails if it ended any other way)."""
    outcome: list[RunCancelled] = []

    async def run() -> None:
        try:
            await session.run(text)
        except RunCancelled as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        assert await server.wait_request(), "the request never reached the server"
        session.cancel("timeout")
    assert len(outcome) == 1, "the run was not cancelled"
    return outcome[0]


@contextmanager
def loopback_server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as server:
        yield server


# the server is plain HTTP; one TLS context spares every test client building its own
_TLS = ssl.create_default_context()


def openai_client(server: LoopbackServer) -> openai.AsyncOpenAI:
    """The real OpenAI SDK client, pointed at ``server``, with no SDK retries."""
    return openai.AsyncOpenAI(
        api_key="test-key",
        base_url=f"{server.url}/v1",
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(verify=_TLS),
    )


def anthropic_client(server: LoopbackServer) -> anthropic.AsyncAnthropic:
    """The real Anthropic SDK client, pointed at ``server``, with no SDK retries."""
    return anthropic.AsyncAnthropic(
        api_key="test-key",
        base_url=server.url,
        max_retries=0,
        http_client=anthropic.DefaultAsyncHttpxClient(verify=_TLS),
    )


# ---------------------------------------------------------------------------------------
# the APIs' wire formats


def openai_completion(
    content: str | None = None,
    tool_calls: Sequence[tuple[str, str, str]] = (),
    *,
    model: str = "gpt-4o-2024-08-06",
    usage: tuple[int, int, int] = (12, 5, 0),
    finish_reason: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A chat completion; ``tool_calls`` are ``(id, name, arguments JSON)``."""
    message: dict[str, Any] = {"role": "assistant", "content": content, **(extra or {})}
    if tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in tool_calls
        ]
    prompt, completion, cached = usage
    return {
        "id": "chatcmpl-loopback",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                "message": message,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-loopback",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def openai_stream(
    text: Sequence[str] = (),
    tool_calls: Sequence[tuple[str, str, Sequence[str]]] = (),
    *,
    model: str = "gpt-4o-2024-08-06",
    usage: tuple[int, int, int] | None = (12, 5, 0),
    done: bool = True,
) -> list[tuple[str | None, Any]]:
    """Chunk events: a role delta, ``text`` pieces, then each tool call ``(id, name,
    argument pieces)`` with its id and name on its first delta, a usage chunk and
    ``[DONE]`` (``done=False`` stops before the finish)."""
    events: list[tuple[str | None, Any]] = [(None, _chunk(model, {"role": "assistant"}))]
    events += [(None, _chunk(model, {"content": piece})) for piece in text]
    for index, (call_id, name, pieces) in enumerate(tool_calls):
        first = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        events.append((None, _chunk(model, {"tool_calls": [first]})))
        for piece in pieces:
            delta = {"index": index, "function": {"arguments": piece}}
            events.append((None, _chunk(model, {"tool_calls": [delta]})))
    if not done:
        return events
    events.append((None, _chunk(model, {}, "tool_calls" if tool_calls else "stop")))
    if usage is not None:
        prompt, completion, cached = usage
        events.append(
            (
                None,
                {
                    "id": "chatcmpl-loopback",
                    "object": "chat.completion.chunk",
                    "created": 1_700_000_000,
                    "model": model,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt,
                        "completion_tokens": completion,
                        "total_tokens": prompt + completion,
                        "prompt_tokens_details": {"cached_tokens": cached},
                    },
                },
            )
        )
    events.append((None, "[DONE]"))
    return events


def openai_error_body(message: str, *, type: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": None, "code": code}}


def anthropic_message(
    blocks: Sequence[dict[str, Any]],
    *,
    model: str = "claude-sonnet-4-6",
    usage: dict[str, int] | None = None,
    stop_reason: str | None = None,
) -> dict[str, Any]:
    has_tools = any(b.get("type") == "tool_use" for b in blocks)
    return {
        "id": "msg_loopback",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": list(blocks),
        "stop_reason": stop_reason or ("tool_use" if has_tools else "end_turn"),
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 12, "output_tokens": 5},
    }


def anthropic_stream(
    blocks: Sequence[tuple[str, Any]],
    *,
    model: str = "claude-sonnet-4-6",
    usage: dict[str, int] | None = None,
    output_tokens: int = 5,
    done: bool = True,
    error: dict[str, Any] | None = None,
) -> list[tuple[str | None, Any]]:
    """Message stream events. ``blocks``: ``("text", [pieces])``, ``("tool_use", (id,
    name, [json pieces]))`` or ``("thinking", (text, signature))``. ``done=False`` stops
    after the blocks' deltas; ``error`` sends an error event there instead."""
    start_usage = {"input_tokens": 12, "output_tokens": 1, **(usage or {})}
    events: list[tuple[str | None, Any]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_loopback",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        ),
        ("ping", {"type": "ping"}),
    ]
    has_tools = False
    for index, (kind, value) in enumerate(blocks):
        if kind == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in value]
        elif kind == "tool_use":
            has_tools = True
            call_id, name, pieces = value
            start = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]
        else:
            thought, signature = value
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": thought},
                {"type": "signature_delta", "signature": signature},
            ]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        if done and error is None:
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    if error is not None:
        events.append(("error", {"type": "error", "error": error}))
        return events
    if not done:
        return events
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": "tool_use" if has_tools else "end_turn",
                    "stop_sequence": None,
                },
                "usage": {"output_tokens": output_tokens},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def anthropic_error_body(message: str, *, type: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type, "message": message}, "request_id": "req_loop"}
