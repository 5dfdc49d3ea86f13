"""The hook a durable engine runs a tinyctx run through: model and tool calls as steps.

A durable-execution engine (DBOS, Temporal) records the output of each *step* of a
workflow and, when the workflow runs again after a crash, hands back the recorded outputs
in order instead of running the steps again. tinyctx gives an engine exactly two kinds of
step, both at the innermost point of the onions, through :class:`EngineSteps`:

- ``tinyctx.model``: one call of the agent's model (what the innermost model handler
  gets, after every layer rewrote the request);
- ``tinyctx.tool:<name>``: one call of the tool ``<name>`` (a failure is recorded as data
  and raised again as a :class:`~tinyctx.ToolError` on replay, so tool layers see it).

A sub-agent a tool runs (``subagent_tool``, or any tool whose class says
``nested_steps = True``) is not one step: the tool runs in the workflow and the
sub-agent's own calls are the steps, named under it, ``tinyctx.subagent:<name>/`` before
the step's name (``tinyctx.subagent:research/tinyctx.model``,
``tinyctx.subagent:research/tinyctx.tool:search``; a sub-agent inside one nests the
prefixes), so a crash inside the sub-agent replays its finished calls instead of running
the whole sub-agent again.

These names are compatibility data: a workflow recorded by one tinyctx version replays on
the next only if the names stay the same, so they never change. Each recorded output is
an envelope ``{"digest": ..., "output": ...}`` of plain JSON (messages as codec
documents). ``digest`` is a SHA-256 of the request the step was called with; on replay the
request is digested again and a different one raises :class:`NondeterminismError` naming
the step and the layer order, instead of silently handing the old answer to a new prompt.

Every other layer (limits, budget, compaction, approvals, memory) stays ordinary code that
the engine runs again on replay; so it must be deterministic given the recorded outputs
(no clock or randomness in a request; see ``docs/durable-engines.md``). Run ids are: an
engine installs a deterministic source with :func:`run_ids_from` while a workflow runs.

Outside an engine (no runner installed) :class:`EngineSteps` passes every call straight
through, so one agent serves both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from .chain import Layer, ModelCall, ToolCallHandler
from .codec import decode_message, encode, encode_message, encode_messages
from .context import CLOCK_SOURCE, REPLAY_SOURCE, RUN_ID_SOURCE, RunContext
from .control import Interrupt, StopWithFinal
from .errors import TinyCtxError, ToolError
from .frozen import thaw
from .messages import AssistantMessage, ToolCall, ToolResult
from .model import ModelRequest, ModelResponse, Usage
from .ordering import Innermost

__all__ = [
    "MODEL_STEP",
    "SUBAGENT_STEP_PREFIX",
    "TOOL_STEP_PREFIX",
    "EngineSteps",
    "NondeterminismError",
    "StepRunner",
    "current_runner",
    "decode_response",
    "encode_response",
    "model_digest",
    "model_payload",
    "request_from_payload",
    "tool_failure",
    "tool_output",
    "tool_payload",
    "run_ids_from",
    "clock_from",
    "replay_from",
    "runs_nested_steps",
    "step_name",
    "steps_through",
    "subagent_steps",
    "tool_digest",
    "with_engine_steps",
]

MODEL_STEP = "tinyctx.model"
"""The step name of a model call (stable compatibility data)."""
TOOL_STEP_PREFIX = "tinyctx.tool:"
"""The step name of a tool call is this prefix and the tool's name (stable)."""
SUBAGENT_STEP_PREFIX = "tinyctx.subagent:"
"""A sub-agent's steps are named ``tinyctx.subagent:<name>/`` and the step's own name
(stable; nested sub-agents nest the prefixes)."""

Envelope = dict[str, Any]
"""What a step records: ``{"digest": str, "output": JSON}``."""


class NondeterminismError(TinyCtxError):
    """A replayed step was called with a request that differs from the recorded one.

    The engine matches steps by position and name only: a layer that put the clock or a
    random value in the request would get the old answer to a new question. ``step`` is the
    step's name, ``index`` its position among the workflow's tinyctx steps (from 0),
    ``layers`` the agent's layer order (outermost first).
    """

    def __init__(self, step: str, index: int, layers: tuple[str, ...], detail: str) -> None:
        self.step = step
        self.index = index
        self.layers = layers
        order = " -> ".join(layers) or "(no layers)"
        super().__init__(
            f"step {index} ({step}) replayed with a different request than the one recorded "
            f"({detail}); a layer made the request nondeterministic (a clock, a random value, "
            f"a changed stack). Layer order, outermost first: {order}"
        )


class StepRunner(Protocol):
    """An engine's way of running one step: record ``run()``'s envelope under ``name``, or
    hand back the envelope recorded at this position on replay."""

    layers: tuple[str, ...]
    """The agent's layer names, outermost first (named in a NondeterminismError)."""

    async def step(
        self,
        name: str,
        digest: str,
        run: Callable[[], Coroutine[Any, Any, Envelope]],
        payload: Callable[[], dict[str, Any]],
    ) -> Envelope:
        """``run()`` makes the envelope in this process (DBOS runs it as the step);
        ``payload()`` is the step's input as JSON, for an engine that runs steps elsewhere
        (Temporal's activities get it instead)."""
        ...

    def next_index(self) -> int:
        """The position of the next tinyctx step in this workflow (0, 1, ...)."""
        ...


_RUNNER: ContextVar[StepRunner | None] = ContextVar("tinyctx.step_runner", default=None)
_SCOPE: ContextVar[str] = ContextVar("tinyctx.step_scope", default="")


def current_runner() -> StepRunner | None:
    """The engine runner installed in this context (None outside a workflow)."""
    return _RUNNER.get()


@contextmanager
def steps_through(runner: StepRunner) -> Iterator[None]:
    """Run model and tool calls in this context as ``runner``'s steps."""
    token = _RUNNER.set(runner)
    try:
        yield
    finally:
        _RUNNER.reset(token)


def step_name(base: str) -> str:
    """``base`` named for the (sub-)agent whose calls run in this context: unchanged for
    the workflow's own agent, ``tinyctx.subagent:<name>/<base>`` inside a sub-agent."""
    return _SCOPE.get() + base


@contextmanager
def subagent_steps(agent: Any, label: str) -> Iterator[Any]:
    """Run the sub-agent ``label`` in this context: inside a workflow its model and tool
    calls are steps of the workflow (``agent`` with :class:`EngineSteps`, names under
    ``tinyctx.subagent:<label>/``); outside one ``agent`` as it is."""
    if _RUNNER.get() is None:
        yield agent
        return
    token = _SCOPE.set(f"{_SCOPE.get()}{SUBAGENT_STEP_PREFIX}{label}/")
    try:
        yield with_engine_steps(agent)
    finally:
        _SCOPE.reset(token)


def runs_nested_steps(tool: object) -> bool:
    """Whether ``tool``'s calls run in the workflow, their sub-agent's calls the steps (a
    tool class that says ``nested_steps = True``, as ``subagent_tool``'s does)."""
    return getattr(tool, "nested_steps", False) is True


@contextmanager
def run_ids_from(seed: str) -> Iterator[None]:
    """Run ids made in this context are ``sha256(seed:n)`` for n = 0, 1, ... (the same on
    every replay of a workflow whose id is ``seed``)."""
    counter = iter(range(1 << 62))

    def source() -> str:
        return hashlib.sha256(f"{seed}:{next(counter)}".encode()).hexdigest()[:32]

    token = RUN_ID_SOURCE.set(source)
    try:
        yield
    finally:
        RUN_ID_SOURCE.reset(token)


@contextmanager
def clock_from(now: Callable[[], float]) -> Iterator[None]:
    """Times a thread keeps (``tinyctx.context.wall_clock``) come from ``now`` in this
    context: a durable engine's deterministic clock, so a replayed write is the write the
    first execution made."""
    token = CLOCK_SOURCE.set(now)
    try:
        yield
    finally:
        CLOCK_SOURCE.reset(token)


@contextmanager
def replay_from(replaying: Callable[[], bool]) -> Iterator[None]:
    """Events emitted in this context while ``replaying()`` is True are stamped
    ``replayed=True``: the engine is handing back recorded steps, so the first execution
    emitted them already (a subscriber or exporter can drop or tag them)."""
    token = REPLAY_SOURCE.set(replaying)
    try:
        yield
    finally:
        REPLAY_SOURCE.reset(token)


# ---------------------------------------------------------------------------------------
# digests and encodings


def _canonical(value: Any) -> str:
    return json.dumps(thaw(value), sort_keys=True, separators=(",", ":"), default=repr)


def model_digest(request: ModelRequest) -> str:
    """SHA-256 of what the model is asked: messages, system prompt, tools, model, settings
    and metadata."""
    digest = hashlib.sha256()
    for document in encode_messages(request.messages, path="request.messages"):
        digest.update(document.encode())
        digest.update(b"\n")
    head = {
        "system": request.system_prompt,
        "model": request.model,
        "tools": [[t.name, t.description, thaw(t.parameters)] for t in request.tools],
        "settings": request.settings,
        "metadata": request.metadata,
        "server_tools": [repr(t) for t in request.server_tools],
    }
    digest.update(_canonical(head).encode())
    return digest.hexdigest()


def tool_digest(call: ToolCall) -> str:
    """SHA-256 of one tool call: its id, name and arguments."""
    return hashlib.sha256(encode(call).encode()).hexdigest()


def _config_json(ctx: RunContext[Any]) -> Any:
    return json.loads(encode(ctx.config))


def model_payload(request: ModelRequest, ctx: RunContext[Any]) -> dict[str, Any]:
    """A model step's input as JSON: the request (as the innermost handler gets it) and
    the run's config. Provider-hosted tools are not carried."""
    return {
        "messages": list(encode_messages(request.messages, path="request.messages")),
        "system_prompt": request.system_prompt,
        "model": request.model,
        "tools": [[t.name, t.description, thaw(t.parameters)] for t in request.tools],
        "settings": thaw(request.settings),
        "metadata": thaw(request.metadata),
        "config": _config_json(ctx),
    }


def request_from_payload(payload: Mapping[str, Any]) -> ModelRequest:
    """The request :func:`model_payload` carried."""
    from .codec import decode_messages
    from .tools import ToolSpec

    return ModelRequest(
        messages=decode_messages(payload["messages"], path="request.messages"),
        tools=tuple(ToolSpec(n, d, p) for n, d, p in payload["tools"]),
        system_prompt=payload["system_prompt"],
        model=payload["model"],
        settings=payload["settings"],
        metadata=payload["metadata"],
    )


def tool_payload(call: ToolCall, ctx: RunContext[Any]) -> dict[str, Any]:
    """A tool step's input as JSON: the call and the run's config."""
    return {"call": json.loads(encode(call)), "config": _config_json(ctx)}


def encode_response(response: ModelResponse) -> dict[str, Any]:
    """A model response as plain JSON (``raw`` and ``info`` are not kept)."""
    control: dict[str, Any] | None = None
    if isinstance(response.control, StopWithFinal):
        control = {"kind": "stop_with_final", "text": response.control.text}
    elif isinstance(response.control, Interrupt):
        control = {
            "kind": "interrupt",
            "node": response.control.node,
            "message": response.control.message,
            "payload": thaw(response.control.payload),
        }
    return {
        "message": encode_message(response.message),
        "usage": json.loads(encode(response.usage)) if response.usage is not None else None,
        "model": response.model,
        "control": control,
    }


def decode_response(data: Mapping[str, Any]) -> ModelResponse:
    """The response :func:`encode_response` wrote."""
    from .codec import decode

    message = decode_message(data["message"])
    if not isinstance(message, AssistantMessage):
        raise TinyCtxError(f"recorded model step holds a {type(message).__name__}")
    usage = data.get("usage")
    control_doc = data.get("control")
    control: StopWithFinal | Interrupt | None = None
    if control_doc is not None:
        if control_doc["kind"] == "stop_with_final":
            control = StopWithFinal(control_doc["text"])
        else:
            control = Interrupt(
                control_doc["node"], control_doc["message"], control_doc.get("payload")
            )
    return ModelResponse(
        message,
        usage=decode(json.dumps(usage), Usage) if usage is not None else None,
        control=control,
        model=data.get("model"),
    )


def tool_output(result: ToolResult) -> dict[str, Any]:
    return {"result": encode_message(result)}


def tool_failure(exc: ToolError) -> dict[str, Any]:
    return {"error": {"type": exc.error_type, "text": exc.text, "content": exc.content}}


# ---------------------------------------------------------------------------------------
# the layer


class EngineSteps(Layer):
    """The innermost layer that makes each model and tool call a step of the engine
    running the workflow (see the module docstring); a pass-through outside one."""

    name = "tinyctx.engine_steps"
    constraints = (Innermost("model"), Innermost("tool"))

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        runner = _RUNNER.get()
        if runner is None:
            return await call_next(request, ctx)
        index = runner.next_index()
        digest = model_digest(request)

        async def run() -> Envelope:
            response = await call_next(request, ctx)
            return {"digest": digest, "output": encode_response(response)}

        name = step_name(MODEL_STEP)
        envelope = await runner.step(name, digest, run, lambda: model_payload(request, ctx))
        _check_digest(runner, name, index, digest, envelope)
        return decode_response(envelope["output"])

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        runner = _RUNNER.get()
        if runner is None:
            return await call_next(call, ctx)
        if runs_nested_steps(ctx.tools.get(call.name)):
            return await _nested(runner, call, ctx, call_next)
        name = step_name(TOOL_STEP_PREFIX + call.name)
        index = runner.next_index()
        digest = tool_digest(call)

        async def run() -> Envelope:
            token = _RUNNER.set(None)  # the step is one opaque call: nothing in it is a step
            try:
                output = tool_output(await call_next(call, ctx))
            except ToolError as exc:
                output = tool_failure(exc)
            finally:
                _RUNNER.reset(token)
            return {"digest": digest, "output": output}

        envelope = await runner.step(name, digest, run, lambda: tool_payload(call, ctx))
        _check_digest(runner, name, index, digest, envelope)
        output = envelope["output"]
        if "error" in output:
            error = output["error"]
            raise ToolError(call, error["type"], error["text"], content=error["content"])
        result = decode_message(output["result"])
        if not isinstance(result, ToolResult):
            raise TinyCtxError(f"recorded step {name} holds a {type(result).__name__}")
        return result


async def _nested(
    runner: StepRunner, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
) -> ToolResult:
    """A sub-agent's tool runs in the workflow: its sub-agent's calls are the steps. The
    workflow's own failures inside it (a replay that differs, the engine cancelling the
    workflow) end the workflow as they would outside a sub-agent, instead of becoming the
    tool's failure that the parent's model reads."""
    try:
        return await call_next(call, ctx)
    except ToolError as exc:
        cause = exc.error
        engine_error = getattr(runner, "engine_error", None)
        if isinstance(cause, NondeterminismError) or (
            cause is not None and engine_error is not None and engine_error(cause)
        ):
            raise cause from None
        raise


def _check_digest(
    runner: StepRunner, name: str, index: int, digest: str, envelope: Envelope
) -> None:
    recorded = envelope.get("digest")
    if recorded != digest:
        raise NondeterminismError(
            name, index, runner.layers, f"recorded digest {recorded!s:.12}, now {digest:.12}"
        )


def with_engine_steps(agent: Any) -> Any:
    """``agent`` with :class:`EngineSteps` as its innermost layer (unchanged if it has one)."""
    from .agent import Agent

    if not isinstance(agent, Agent):
        raise TypeError(f"with_engine_steps needs an Agent, got {type(agent).__name__}")
    if any(isinstance(m, EngineSteps) for m in agent.middleware):
        return agent
    return agent.evolve(middleware=(*agent.middleware, EngineSteps()))
