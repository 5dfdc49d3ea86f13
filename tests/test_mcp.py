"""Tools from MCP servers: real servers (tests/mcp_server.py) over stdio, started by the tests."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tinyctx import (
    Agent,
    ConfigError,
    EventSink,
    ImagePart,
    RunCancelled,
    Session,
    TextPart,
    ToolResult,
    UserMessage,
    tool,
)
from tinyctx.mcp import (
    MCPCall,
    MCPConnectError,
    MCPDisconnected,
    MCPServerHTTP,
    MCPServerStdio,
    MCPToolConflict,
    MCPTools,
    MCPToolSkipped,
    get_prompt,
    mcp_servers,
    read_resource,
)
from tinyctx.parts import DocumentPart
from tinyctx.testing import ScriptedModel, call, capture_events, reply

SERVER = str(Path(__file__).with_name("mcp_server.py"))
LIMIT = 60  # seconds any one test may take: a hung server fails the test, never the suite


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "server.log"


@pytest.fixture
def errlog(tmp_path: Path) -> Iterator[Any]:
    """The servers' stderr (tracebacks the failing tools log) kept out of the test output."""
    with (tmp_path / "stderr.txt").open("w", encoding="utf-8") as f:
        yield f


def stdio(log: Path, errlog: Any, mode: str = "stdio", **options: Any) -> MCPServerStdio:
    options.setdefault("name", "t")
    options.setdefault("connect_timeout", 20.0)
    return MCPServerStdio(
        sys.executable, [SERVER, mode], env={"MCP_TEST_LOG": str(log)}, errlog=errlog, **options
    )


def results(messages: tuple[Any, ...]) -> list[ToolResult]:
    return [m for m in messages if isinstance(m, ToolResult)]


async def run_once(
    server: Any, *script: Any, middleware: tuple[Any, ...] = (), **agent: Any
) -> Any:
    model = ScriptedModel(script)
    built = Agent(model, middleware=(MCPTools(server), *middleware), **agent)
    async with Session(built) as session:
        result = await session.run("go")
    return result, model


async def wait_for_line(path: Path, text: str) -> None:
    """Until the server wrote ``text`` to its log (bounded by the test's own limit)."""
    file = anyio.Path(path)
    while not (await file.exists() and text in await file.read_text(encoding="utf-8")):  # noqa: ASYNC110 - another process writes it
        await anyio.sleep(0.02)


@pytest.fixture
async def server(log: Path, errlog: Any) -> AsyncIterator[MCPServerStdio]:
    with anyio.fail_after(LIMIT):
        async with stdio(log, errlog) as opened:
            yield opened


class TestTools:
    """A server's tools run in a session like local tools."""

    async def test_tools_are_offered_with_their_schemas(self, server: MCPServerStdio) -> None:
        """The model sees each tool with the input schema the server gave, and calls run."""
        with anyio.fail_after(LIMIT):
            result, model = await run_once(server, reply("", call("add", a=2, b=3)), "done")
        specs = {s.name: s for s in model.requests[0].tools}
        assert {"add", "echo", "picture", "record"} <= set(specs)
        assert specs["add"].parameters["required"] == ("a", "b")
        assert specs["add"].parameters["properties"]["a"]["type"] == "integer"
        assert specs["add"].description == "Add two integers."
        assert [r.content for r in results(result.messages)] == ["5"]
        assert result.final_text == "done"

    async def test_bad_arguments_take_the_tool_error_path(self, server: MCPServerStdio) -> None:
        """Arguments off the schema give an InvalidArguments result naming the field; the
        server is never called."""
        with anyio.fail_after(LIMIT):
            result, _ = await run_once(server, reply("", call("add", a="x", b=1)), "done")
        (error,) = results(result.messages)
        assert error.is_error
        assert error.content.startswith("Error (InvalidArguments)")
        assert "'arguments.a'" in error.content
        assert "integer" in error.content

    async def test_is_error_is_a_tool_error(self, server: MCPServerStdio) -> None:
        """A result with isError becomes an error result with the server's text, and a
        tool.failed event, as a local tool's exception does."""
        with anyio.fail_after(LIMIT), capture_events("tool.failed") as failed:
            result, _ = await run_once(server, reply("", call("fail", message="boom")), "done")
        (error,) = results(result.messages)
        assert error.is_error
        assert error.content == "Error (MCPToolError): Error executing tool fail: boom"
        assert [e.error_type for e in failed] == ["MCPToolError"]  # type: ignore[attr-defined]

    async def test_images_and_resources_become_parts(self, server: MCPServerStdio) -> None:
        """An image is an ImagePart (its size read from its header), an embedded text
        resource a text/plain document titled with its URI, text a TextPart."""
        with anyio.fail_after(LIMIT):
            result, _ = await run_once(server, reply("", call("picture")), "done")
        (picture,) = results(result.messages)
        image, note, caption = picture.content
        assert isinstance(image, ImagePart) and image.size == (3, 2)
        assert isinstance(note, DocumentPart) and note.title == "note://picture"
        assert note.text == "red"
        assert caption == TextPart("a red picture")

    async def test_a_local_tool_and_mcp_tools_share_a_run(self, server: MCPServerStdio) -> None:
        """An agent's own tools and a server's are offered side by side."""

        @tool
        def shout(text: str) -> str:
            """Upper-case the text."""
            return text.upper()

        with anyio.fail_after(LIMIT):
            result, model = await run_once(
                server,
                reply("", call("shout", text="a"), call("echo", text="b")),
                "done",
                tools=[shout],
            )
        assert [r.content for r in results(result.messages)] == ["A", "b"]
        assert model.requests[0].tools[0].name == "shout"


class TestSharing:
    """One open server serves many sessions at once."""

    async def test_concurrent_sessions_share_one_connection(self, server: MCPServerStdio) -> None:
        """Runs of several sessions call the server at the same time; each gets its own
        answers, and each run's registry is its own."""
        answers: dict[int, list[str]] = {}

        async def one(n: int) -> None:
            script = [reply("", call("echo", text=f"s{n}-{i}")) for i in range(3)]
            model = ScriptedModel([*script, "done"])
            async with Session(Agent(model, middleware=[MCPTools(server)])) as session:
                result = await session.run("go")
            answers[n] = [r.content for r in results(result.messages)]

        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as group:
                for n in range(4):
                    group.start_soon(one, n)
        assert answers == {n: [f"s{n}-{i}" for i in range(3)] for n in range(4)}


class TestNames:
    """Two tools of one name are refused, never silently overridden."""

    async def test_two_servers_with_one_tool_name_clash(self, log: Path, errlog: Any) -> None:
        """Without a prefix the run refuses to start, naming both servers."""
        with anyio.fail_after(LIMIT):
            async with stdio(log, errlog, name="a") as a, stdio(log, errlog, name="b") as b:
                agent = Agent(ScriptedModel(["done"]), middleware=[MCPTools(a, b)])
                async with Session(agent) as session:
                    with pytest.raises(MCPToolConflict, match="'a' and 'b'.*prefix="):
                        await session.run("go")

    async def test_a_prefix_or_a_filter_resolves_a_clash(self, log: Path, errlog: Any) -> None:
        """A prefixed server's tools are offered as prefix_name; include= limits a server."""
        with anyio.fail_after(LIMIT):
            async with (
                stdio(log, errlog, name="a", include=["add"]) as a,
                stdio(log, errlog, name="b", prefix="b", exclude=["crash"]) as b,
            ):
                model = ScriptedModel(
                    [reply("", call("add", a=1, b=1), call("b_add", a=2, b=2)), "ok"]
                )
                async with Session(Agent(model, middleware=[MCPTools(a, b)])) as session:
                    result = await session.run("go")
        names = [s.name for s in model.requests[0].tools]
        assert names[0] == "add" and "b_add" in names and "b_crash" not in names
        assert "echo" not in names
        assert [r.content for r in results(result.messages)] == ["2", "4"]

    async def test_a_server_tool_may_not_take_an_agent_tools_name(
        self, server: MCPServerStdio
    ) -> None:
        """A server tool named like one of the agent's tools is a conflict."""

        @tool
        def add(a: int, b: int) -> int:
            """Local add."""
            return a + b

        with anyio.fail_after(LIMIT), pytest.raises(MCPToolConflict, match="'add'.*already"):
            await run_once(server, "done", tools=[add])

    def test_bad_settings_name_the_field(self) -> None:
        """Settings are checked at construction, naming the field and what is allowed."""
        with pytest.raises(ConfigError, match="call_timeout"):
            MCPServerStdio("python", call_timeout=0)
        with pytest.raises(ConfigError, match="include"):
            MCPServerStdio("python", include="add")
        with pytest.raises(ConfigError, match=r"MCPServerStdio\.exclude=.*not one string"):
            MCPServerStdio("python", exclude=["add", ""])
        assert MCPServerStdio("python", include=(n for n in ["add"])).include == {"add"}
        with pytest.raises(ConfigError, match=r"MCPServerStdio\.args"):
            MCPServerStdio("python", ["-m", 3])
        with pytest.raises(ConfigError, match="url"):
            MCPServerHTTP("ftp://example")
        with pytest.raises(ConfigError, match="url"):
            MCPServerHTTP("http://[::1")
        with pytest.raises(ConfigError, match="servers"):
            MCPTools()
        one = MCPServerStdio("python", name="x")
        with pytest.raises(ConfigError, match=r"servers\[1\].name"):
            MCPTools(one, MCPServerStdio("python", name="x"))

    @pytest.mark.parametrize(
        "field", ["call_timeout", "connect_timeout", "reconnect_wait", "backoff", "max_backoff"]
    )
    @pytest.mark.parametrize("value", [0, -1.5, True, float("nan"), float("inf"), "5"])
    def test_every_duration_is_a_finite_positive_number(self, field: str, value: object) -> None:
        """Each duration names its field, the class and 'seconds > 0' for any other value."""
        with pytest.raises(ConfigError, match=rf"MCPServerStdio\.{field}.*seconds > 0"):
            MCPServerStdio("python", **{field: value})

    def test_durations_that_may_be_none_say_so(self) -> None:
        """None switches call_timeout and reconnect_wait off; max_backoff >= backoff."""
        MCPServerStdio("python", call_timeout=None, reconnect_wait=None)
        with pytest.raises(ConfigError, match="or None"):
            MCPServerStdio("python", call_timeout=-1)
        with pytest.raises(ConfigError, match=r"max_backoff.*>= backoff"):
            MCPServerStdio("python", backoff=2.0, max_backoff=1.0)
        with pytest.raises(ConfigError, match="events.*EventSink or None"):
            MCPServerStdio("python", events=print)


class TestMalformedServers:
    """A server that lists malformed tools keeps its good ones."""

    async def test_malformed_schemas_are_skipped_with_a_reason(
        self, log: Path, errlog: Any
    ) -> None:
        """Tools whose schemas are not valid JSON Schema are left out (an event says why);
        the server's other tools work."""
        sink = EventSink(logger=None)
        skipped: list[Any] = []
        sink.subscribe(lambda e: skipped.append(e) if isinstance(e, MCPToolSkipped) else None)
        with anyio.fail_after(LIMIT):
            async with stdio(log, errlog, "malformed", events=sink) as bad:
                assert [t.name for t in bad.tools] == ["good"]
                result, _ = await run_once(bad, reply("", call("good", x=1)), "done")
        assert sorted(name for name, _ in bad.skipped) == ["bad_minimum", "bad_type"]
        assert all("not valid JSON Schema" in why for _, why in bad.skipped)
        assert sorted(e.tool for e in skipped) == ["bad_minimum", "bad_type"]
        assert [r.content for r in results(result.messages)] == ["good ran"]

    async def test_a_server_that_will_not_start_fails_at_open(
        self, tmp_path: Path, errlog: Any
    ) -> None:
        """A command that exits at once fails `async with` with MCPConnectError."""
        missing = MCPServerStdio(
            sys.executable, [str(tmp_path / "nowhere.py")], name="gone", errlog=errlog
        )
        with anyio.fail_after(LIMIT), pytest.raises(MCPConnectError, match="'gone'"):
            async with missing:
                pass  # pragma: no cover


class TestLifecycle:
    """Crashes, hangs, cancellation and changing tool lists."""

    async def test_a_server_never_opened_fails_the_run_at_start(
        self, log: Path, errlog: Any
    ) -> None:
        """A run with a server outside its `async with` fails before the model is called,
        saying how to open it."""
        model = ScriptedModel(["never"])
        closed = stdio(log, errlog)
        with anyio.fail_after(LIMIT):
            async with Session(Agent(model, middleware=[MCPTools(closed)])) as session:
                with pytest.raises(MCPConnectError, match="not open.*async with server"):
                    await session.run("go")
        assert model.calls == 0

    async def test_a_crash_mid_call_is_an_error_result_and_reconnects(
        self, server: MCPServerStdio
    ) -> None:
        """The call that crashed the server gets an error result; the run goes on, and the
        next call runs on a new process."""
        with anyio.fail_after(LIMIT):
            result, _ = await run_once(
                server, reply("", call("crash")), reply("", call("add", a=1, b=1)), "done"
            )
        crashed, added = results(result.messages)
        assert crashed.is_error and "closed the connection" in crashed.content
        assert not added.is_error and added.content == "2"
        assert result.final_text == "done"

    async def test_a_server_that_stays_down_is_retried_with_backoff(
        self, tmp_path: Path, log: Path, errlog: Any
    ) -> None:
        """Each failed attempt waits twice as long as the last, up to max_backoff; a call
        meanwhile fails with an error result naming the last error; once the server can
        start again the connection is back."""
        once = tmp_path / "started"
        sink = EventSink(logger=None)
        down: list[Any] = []
        sink.subscribe(lambda e: down.append(e) if isinstance(e, MCPDisconnected) else None)
        # the first start serves; later ones exit at once while the file exists
        first_start_only = (
            "import os, sys\n"
            f"if os.path.exists({str(once)!r}): sys.exit(4)\n"
            f"open({str(once)!r}, 'w').close()\n"
            f"os.execv(sys.executable, [sys.executable, {SERVER!r}, 'stdio'])\n"
        )
        flaky = MCPServerStdio(
            sys.executable,
            ["-c", first_start_only],
            name="flaky",
            env={"MCP_TEST_LOG": str(log)},
            errlog=errlog,
            backoff=0.01,
            max_backoff=0.04,
            connect_timeout=20,
            reconnect_wait=0.2,
            events=sink,
        )
        with anyio.fail_after(LIMIT):
            async with flaky:
                result, _ = await run_once(
                    flaky, reply("", call("crash")), reply("", call("echo", text="x")), "done"
                )
                while len(down) < 5:  # noqa: ASYNC110 - the supervisor retries on its own
                    await anyio.sleep(0.01)
                once.unlink()
                while not flaky.connected:  # noqa: ASYNC110 - as above
                    await anyio.sleep(0.01)
                back, _ = await run_once(flaky, reply("", call("echo", text="back")), "done")
        assert [e.retry_in for e in down[:5]] == [0.01, 0.02, 0.04, 0.04, 0.04]
        crashed, meanwhile = results(result.messages)
        assert crashed.is_error
        assert meanwhile.is_error and "not connected (reconnecting" in meanwhile.content
        assert [r.content for r in results(back.messages)] == ["back"]

    async def test_a_hung_call_times_out_and_the_server_is_told(
        self, log: Path, errlog: Any
    ) -> None:
        """A call past call_timeout fails with an error result; the SDK cancels the request
        on the server, which stays usable."""
        with anyio.fail_after(LIMIT):
            async with stdio(log, errlog, call_timeout=0.5) as slow:
                result, _ = await run_once(
                    slow, reply("", call("hang")), reply("", call("echo", text="still")), "done"
                )
                await wait_for_line(log, "cancelled")
        hung, echoed = results(result.messages)
        assert hung.is_error and "in time" in hung.content
        assert echoed.content == "still"

    async def test_cancelling_the_run_cancels_the_request(self, server: Any, log: Path) -> None:
        """cancel_run() during a call ends the run with RunCancelled, the call keeps its
        pairing, and the server's handler is cancelled."""
        model = ScriptedModel([reply("", call("hang")), "never"])
        with anyio.fail_after(LIMIT):
            async with Session(Agent(model, middleware=[MCPTools(server)])) as session:

                async def cancel_when_hanging() -> None:
                    await wait_for_line(log, "hanging")
                    session.cancel_run("user pressed stop")

                async with anyio.create_task_group() as group:
                    group.start_soon(cancel_when_hanging)
                    with pytest.raises(RunCancelled, match="user pressed stop"):
                        await session.run("go")
                await wait_for_line(log, "cancelled")
                (interrupted,) = results(session.conversation_messages)
        assert interrupted.is_error

    async def test_list_changed_refreshes_before_the_next_model_call(
        self, server: MCPServerStdio
    ) -> None:
        """A tool the server adds during a run is offered from the next model call on, and
        runs; the call that added it saw the old list."""
        with anyio.fail_after(LIMIT), capture_events("mcp.tools_changed") as changed:
            result, model = await run_once(
                server,
                reply("", call("grow")),
                reply("", call("echo", text="x")),
                reply("", call("double", x=21)),
                "done",
            )
        before = {s.name for s in model.requests[0].tools}
        after = {s.name for s in model.requests[-1].tools}
        assert "double" not in before and after == before | {"double"}
        assert results(result.messages)[-1].content == "42"
        assert any("double" in e.added for e in changed)  # type: ignore[attr-defined]

    async def test_a_removed_tool_is_withdrawn_before_the_next_model_call(
        self, server: MCPServerStdio
    ) -> None:
        """A tool the server removes is no longer offered from the next model call on; a
        call to it then is an UnknownTool error result."""
        with anyio.fail_after(LIMIT):
            result, model = await run_once(
                server,
                reply("", call("shrink")),
                reply("", call("add", a=1, b=1)),
                reply("", call("echo", text="gone?")),
                "done",
            )
        assert "echo" in {s.name for s in model.requests[0].tools}
        assert "echo" not in {s.name for s in model.requests[-1].tools}
        gone = results(result.messages)[-1]
        assert gone.is_error and gone.content.startswith("Error (UnknownTool)")


class TestResourcesAndPrompts:
    """Layers and tools reach a run's servers through the context."""

    async def test_a_tool_reads_a_resource_and_a_prompt_through_the_context(
        self, server: MCPServerStdio
    ) -> None:
        """mcp_servers(ctx) names the run's servers; resources come as parts, prompts as
        messages."""
        seen: dict[str, Any] = {}

        async def peek(request: Any, ctx: Any, call_next: Any) -> Any:
            found = mcp_servers(ctx)["t"]
            seen["resource"] = await read_resource(found, "note://greeting", ctx)
            seen["prompt"] = await get_prompt(found, "review", {"code": "x = 1"}, ctx)
            return await call_next(request, ctx)

        with anyio.fail_after(LIMIT):
            await run_once(server, "done", middleware=(peek,))
        (document,) = seen["resource"]
        assert isinstance(document, DocumentPart) and document.text == "hello from the server"
        assert seen["prompt"] == (UserMessage("Please review: x = 1"),)


class TestTracing:
    """Each call to a server reports what its execute_tool span needs."""

    async def test_a_call_reports_its_mcp_attributes(self, server: MCPServerStdio) -> None:
        """An MCPCall event names the method, transport and protocol version, and marks an
        isError answer as tool_error; arguments refused before sending report no call."""
        with anyio.fail_after(LIMIT), capture_events(MCPCall) as calls:
            await run_once(
                server,
                reply("", call("add", a=1, b=1), call("fail", message="no"), call("add", a="x")),
                "done",
            )
        ok, failed = calls
        assert ok.method == "tools/call" and ok.transport == "stdio"  # type: ignore[attr-defined]
        assert ok.protocol_version and not ok.is_error  # type: ignore[attr-defined]
        assert dict(ok.attributes)["network.transport"] == "pipe"  # type: ignore[attr-defined]
        assert failed.is_error and failed.error_type == "tool_error"  # type: ignore[attr-defined]
