"""Write/read symmetry (principle 12, issue 32): any value the public API accepts into a
thread (messages with metadata, content parts, tool-call arguments from a model, control
payloads, layer state) survives write -> new process -> load unchanged, or was refused at
the API boundary with a clear error; on every store, trio and asyncio.

Each example runs one session on a thread of its own, in this process; when the examples
are done, one new process (tests/symmetry_worker.py) opens every thread they wrote and
compares it with what this process expected, by a comparison that does not use the codec.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tests.servers import unique_name
from tests.symmetry_worker import KEEPER, canonical, open_store, thread_view
from tinyctx import (
    Agent,
    AssistantMessage,
    ImagePart,
    Interrupt,
    Interrupted,
    Layer,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    Session,
    TextPart,
    ToolCall,
    UserMessage,
    tool,
)
from tinyctx.codec import CodecError, decode_state
from tinyctx.formats._common import parse_arguments
from tinyctx.messages import valid_message
from tinyctx.state import StateError
from tinyctx.testing import ScriptedModel, reply
from tinyctx.tools import Injected

WORKER = Path(__file__).with_name("symmetry_worker.py")
ROOT = Path(__file__).resolve().parents[1]

# -- what enters a thread -------------------------------------------------------------------

SURROGATES = ["\ud800", "\udfff", "a\udc00b", "\ud83d\ude00", "\ud83d", "é", "\x00", "日本"]
TEXT = st.lists(st.text(max_size=6) | st.sampled_from(SURROGATES), max_size=3).map("".join)


class Huge(int):
    """An integer that hypothesis can print even past 4300 digits (``repr`` by size)."""

    def __repr__(self) -> str:
        return f"Huge(<{self.bit_length()} bits>)"


HUGE = [2**63, -(2**63) - 1, 2**64 + 1, 10**30, 10**4299, -(10**4299), 10**4300, -(10**5000)]
EXTREMES = st.integers(0, len(HUGE) - 1).map(lambda i: Huge(HUGE[i])) | st.sampled_from(
    [math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]
)
# most leaves are ordinary (so most threads get written), one in four is at an edge
ORDINARY = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT
SCALARS = st.one_of(ORDINARY, ORDINARY, ORDINARY, EXTREMES)
DEPTHS = [1, 50, 98, 99, 100, 101, 350, 490, 600]


def _nest(leaf: Any, levels: int, in_lists: bool) -> Any:
    """``leaf`` inside ``levels`` lists or objects."""
    value = leaf
    for _ in range(levels):
        value = [value] if in_lists else {"k": value}
    return value


JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
VALUES = (
    JSON
    | st.builds(_nest, SCALARS, st.sampled_from(DEPTHS), st.booleans())
    | st.dictionaries(st.integers(0, 3), SCALARS, min_size=1, max_size=1)  # a non-str key
)
URLS = st.sampled_from(
    [
        "https://example.com/a.png",
        "https://bucket.example.com/x.png?X-Amz-Signature=" + "f" * 200,
        "https://example.com/\ud800.png",
    ]
)
# a message's content: text, or parts (built when the example runs: a part may be refused)
CONTENT = TEXT | st.lists(
    st.tuples(st.just("text"), st.text(min_size=1, max_size=8) | TEXT)
    | st.tuples(st.just("image"), URLS),
    min_size=1,
    max_size=3,
)


def _content(spec: str | list[tuple[str, str]]) -> Any:
    """The content a CONTENT spec stands for (parts built now: a part may be refused)."""
    if isinstance(spec, str):
        return spec
    return tuple(TextPart(v) if kind == "text" else ImagePart(url=v) for kind, v in spec)


# tool-call arguments as a model sends them (JSON text), past what a thread keeps too
ARGUMENT_TEXTS = st.sampled_from(
    [
        '{"q": NaN}',
        '{"q": [Infinity]}',
        '{"q": 1e400}',
        '{"q": ' + "7" * 4301 + "}",
        '{"q": ' + '{"k":' * 101 + "1" + "}" * 101 + "}",
        '{"q": ' + "[" * 99 + "1" + "]" * 99 + "}",
        "not json",
        "[1, 2]",
        "",
    ]
)


def _argument_text(value: Any) -> str:
    try:
        return json.dumps({"q": value}, allow_nan=True)
    except (ValueError, RecursionError):  # an integer past 4300 digits: deep nesting instead
        return '{"q": ' + "[" * 120 + "0" + "]" * 120 + "}"


ARGUMENTS = ARGUMENT_TEXTS | JSON.map(_argument_text)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """One thread's worth of input: the user's message, the model's reply (text and tool
    calls), an interrupt a tool requests, and a layer's thread state."""
    return {
        "content": draw(CONTENT),
        "metadata": draw(st.one_of(*[st.dictionaries(TEXT, VALUES, max_size=2)] * 3, VALUES)),
        "essential": draw(st.booleans()),
        "reply": draw(TEXT),
        "arguments": draw(
            st.lists(ARGUMENTS, min_size=draw(st.sampled_from([0, 1, 1])), max_size=2)
        ),
        "interrupt": draw(
            st.none()
            | st.tuples(TEXT, TEXT, JSON)
            | st.tuples(TEXT, TEXT, VALUES)
            | st.tuples(TEXT | st.integers() | st.none(), TEXT | st.integers(), VALUES)
        ),
        "state": draw(st.none() | VALUES),
    }


# -- the agent -------------------------------------------------------------------------------


class _Box:
    def __init__(self, value: Any = None) -> None:
        self.value = value

    def to_json(self) -> Any:
        return self.value

    @classmethod
    def from_json(cls, value: Any) -> _Box:
        return cls(value)


class Keeper(Layer):
    """Keeps one value as its thread state and as its run's state (which a pause keeps in
    the checkpoint), set on every model call."""

    name = KEEPER

    def __init__(self, value: Any) -> None:
        self.value = value

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        ctx.thread_state(self, _Box).value = self.value
        ctx.run_state(self, _Box).value = self.value
        return await call_next(request, ctx)


def _refused(build: Any) -> tuple[Any, BaseException | None]:
    """``build()``, or the clear error the API refused it with (never a RecursionError)."""
    try:
        return build(), None
    except (TypeError, ValueError) as exc:
        error = exc
    assert str(error), f"{type(error).__name__} without a message"
    return None, error


def _agent(scenario: dict[str, Any], calls: tuple[ToolCall, ...], pause: Any) -> Agent[Any]:
    @tool
    async def echo(ctx: Injected[RunContext[Any]], q: Any = None) -> str:
        """Answer, and ask for the pause if there is one."""
        if pause is not None:
            ctx.control.request(pause)
        return "echo"

    model = ScriptedModel([reply(scenario["reply"], *calls), reply("done")])
    middleware = [Keeper(scenario["state"])] if scenario["state"] is not None else []
    return Agent(model, tools=[echo], middleware=middleware)


def _calls(scenario: dict[str, Any]) -> tuple[ToolCall, ...]:
    """The model's calls, read from its argument text as the adapters read it: nothing a
    model sends makes a call the loop cannot keep (that is invalid arguments instead)."""
    calls = []
    for index, text in enumerate(scenario["arguments"]):
        arguments, invalid = parse_arguments(text)
        calls.append(ToolCall(f"c{index}", "echo", arguments, invalid_arguments=invalid))
    return tuple(calls)


async def _example(
    spec: dict[str, Any], thread_id: str, scenario: dict[str, Any]
) -> dict[str, Any]:
    """Run one scenario on a new thread; what the new process must load from it."""
    user, refused = _refused(
        lambda: UserMessage(
            _content(scenario["content"]),
            metadata=scenario["metadata"],
            essential=scenario["essential"],
        )
    )
    if refused is not None:
        event("input refused when built")
        user = UserMessage("refused input")
    pause = None
    if scenario["interrupt"] is not None:
        node, text, payload = scenario["interrupt"]
        pause, _ = _refused(lambda: Interrupt(node, text, payload=payload))
    calls = _calls(scenario)
    store = open_store(spec)
    try:
        agent = _agent(scenario, calls, pause)
        failed: BaseException | None = None
        try:
            async with Session(agent, thread_id=thread_id, store=store) as session:
                with contextlib.suppress(Interrupted):
                    await session.run(user)
                messages, paused = session.conversation_messages, session.paused
        except (CodecError, StateError) as exc:  # refused where it entered, and named
            failed = exc
        assert failed is None or "input[0]" in str(failed) or KEEPER in str(failed), failed
        record = await store.load_thread(thread_id)
        event("refused by the run" if failed else "paused" if paused else "completed")
        if failed is None:
            # what went in is what the thread holds (text from outside made valid Unicode)
            assert messages[0] == valid_message(user)
            assert messages[1] == valid_message(AssistantMessage(scenario["reply"], calls))
            if paused is not None:
                assert pause is not None
                assert (paused.node, paused.message, paused.payload) == (
                    pause.node,
                    pause.message,
                    pause.payload,
                )
                if scenario["state"] is not None:
                    assert canonical(paused.state[KEEPER]) == canonical(scenario["state"])
            if scenario["state"] is not None:
                kept = decode_state(record.state or '{"v":1}').get(KEEPER)
                assert canonical(kept) == canonical(scenario["state"])
            expected = thread_view(messages, paused, record.state)
        else:  # the thread is as it was before the refused step, and it opens
            async with Session(Agent(ScriptedModel()), thread_id=thread_id, store=store) as again:
                expected = thread_view(again.conversation_messages, again.paused, record.state)
        out: dict[str, Any] = {"id": thread_id, "expected": expected}
        if spec["kind"] == "memory":
            out["messages"] = list(record.messages)
            out["checkpoint"], out["state"] = record.checkpoint, record.state
        return out
    finally:
        await store.aclose()


# -- the property ------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Where the examples write: one store (a file, a schema, a prefix) for all of them."""
    kind = request.param
    if kind == "sqlite":
        yield {"kind": kind, "path": str(tmp_path / "threads.db")}
    elif kind == "postgres":
        url = request.getfixturevalue("postgres_url")
        yield {"kind": kind, "url": url, "schema": request.getfixturevalue("postgres_schema")}
    elif kind == "redis":
        url = request.getfixturevalue("redis_url")
        yield {"kind": kind, "url": url, "prefix": request.getfixturevalue("redis_prefix")}
    else:
        yield {"kind": kind}


@pytest.fixture(params=["trio", "asyncio"])
def backend(request: pytest.FixtureRequest) -> str:
    """The async backend each example runs on (a sync test: every example is one anyio.run)."""
    return str(request.param)


@pytest.mark.slow  # a new interpreter per value and store
class TestWriteReadSymmetry:
    """What a thread accepts, a new process loads back unchanged; the rest is refused."""

    def test_every_value_survives_a_new_process_or_is_refused(
        self, store_spec: dict[str, Any], backend: str, tmp_path: Path
    ) -> None:
        """Hypothesis writes threads here; one new process loads them all and compares."""
        written: list[dict[str, Any]] = []
        prefix = unique_name("sym")

        @given(scenarios())
        def example(scenario: dict[str, Any]) -> None:
            thread_id = f"{prefix}-{len(written)}"
            written.append(anyio.run(_example, store_spec, thread_id, scenario, backend=backend))

        example()
        plan = tmp_path / "plan.json"
        plan.write_text(
            json.dumps({"backend": backend, "store": store_spec, "threads": written}),
            encoding="ascii",
        )
        # the new process imports the tinyctx this one does (the checkout's), not another
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        done = subprocess.run(
            [sys.executable, str(WORKER), str(plan)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == []
