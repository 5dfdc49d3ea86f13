"""Approvals: pause tool calls for a human's review and resume with a decision per call."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    Approve,
    AssistantMessage,
    ConfigError,
    Edit,
    Interrupt,
    Interrupted,
    InvalidCheckpoint,
    Layer,
    Reject,
    Respond,
    ResumeError,
    Session,
    StopWithFinal,
    ToolResult,
    tool,
)
from tinyctx.decisions import decision_from_json, decisions_from_json
from tinyctx.frozen import thaw
from tinyctx.messages import check_pairing
from tinyctx.middleware import Approvals, Review
from tinyctx.middleware.approvals import ReviewDecided, ReviewRequested, review_calls
from tinyctx.testing import (
    FakeTool,
    ScriptedModel,
    call,
    capture_events,
    quiet_context,
    reply,
    run_tool_layer,
)
from tinyctx.tools import ToolArgumentError

INT_SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


def results_by_id(messages: Any) -> dict[str, list[ToolResult]]:
    out: dict[str, list[ToolResult]] = {}
    for message in messages:
        if isinstance(message, ToolResult):
            out.setdefault(message.tool_call_id, []).append(message)
    return out


def last_calls(messages: Any) -> dict[str, Any]:
    """The tool calls of the last assistant message with calls, by id."""
    for message in reversed(messages):
        if isinstance(message, AssistantMessage) and message.tool_calls:
            return {c.id: c for c in message.tool_calls}
    return {}


class Deploy:
    """A recording deploy/delete pair: the tools a reviewer guards."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, dict[str, Any]]] = []

        @tool
        async def deploy(service: str, replicas: int = 1) -> str:
            """Deploy a service.

            Args:
                service: the service name.
                replicas: how many copies.
            """
            self.ran.append(("deploy", {"service": service, "replicas": replicas}))
            return f"deployed {service} x{replicas}"

        @tool
        async def delete(path: str) -> str:
            """Delete a file."""
            self.ran.append(("delete", {"path": path}))
            return f"deleted {path}"

        @tool
        async def status() -> str:
            """Report status."""
            self.ran.append(("status", {}))
            return "all green"

        self.tools = [deploy, delete, status]


async def paused_session(
    layer: Approvals, *calls: Any, after: str = "done"
) -> tuple[Session[Any], Deploy, ScriptedModel, Interrupted]:
    """Start a run whose first response holds ``calls``; return it paused for review."""
    box = Deploy()
    model = ScriptedModel([reply("", *calls), after])
    agent = Agent(model=model, tools=box.tools, middleware=[layer])
    session: Session[Any] = Session(agent, thread_id="review")
    await session.__aenter__()
    with pytest.raises(Interrupted) as info:
        await session.run("ship it")
    return session, box, model, info.value


class TestConfiguration:
    """Bad review configurations fail at construction with the field named."""

    @pytest.mark.parametrize(
        ("review", "field"),
        [
            ([], "review"),
            ({"": True}, "review"),
            ({"deploy": "yes"}, "review['deploy']"),
            (42, "review"),
            (["deploy", 3], "review"),
            ({"deploy": True, 3: True}, "review"),
        ],
    )
    def test_bad_review_config(self, review: Any, field: str) -> None:
        """Each malformed `review` argument names itself in a ConfigError."""
        with pytest.raises(ConfigError) as info:
            Approvals(review)
        assert info.value.field == field

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"allowed": ()}, "allowed"),
            ({"allowed": 3}, "allowed"),
            ({"allowed": ("approve", "veto")}, "allowed"),
            ({"allowed": ("approve", "approve")}, "allowed"),
            ({"allowed": "veto"}, "allowed"),
            ({"description": 3}, "description"),
            ({"when": "always"}, "when"),
        ],
    )
    def test_bad_review_options(self, kwargs: dict[str, Any], field: str) -> None:
        """Review rejects unknown decision kinds, duplicates and non-callables."""
        with pytest.raises(ConfigError) as info:
            Review(**kwargs)
        assert info.value.field == field

    def test_forms_of_choosing_calls(self) -> None:
        """A name, names, a mapping with a predicate, or a function choose the reviewed calls."""
        big = call("deploy", id="a", service="web", replicas=9)
        small = call("deploy", id="b", service="web", replicas=1)
        other = call("status", id="c")
        assert Approvals("deploy").review_for(small) is not None
        assert Approvals(["deploy", "delete"]).review_for(other) is None
        by_size = Approvals({"deploy": Review(when=lambda c: c.arguments["replicas"] > 3)})
        assert (by_size.review_for(big) is not None, by_size.review_for(small)) == (True, None)
        assert Approvals({"deploy": False}).review_for(big) is None
        per_call = Approvals(lambda c: c.name == "status")
        assert (per_call.review_for(other) is not None, per_call.review_for(big)) == (True, None)


class TestThePause:
    """A response with calls under review pauses once, listing every such call."""

    async def test_one_interrupt_lists_every_call_under_review(self) -> None:
        """The payload names id, name, arguments, description and allowed decisions."""
        layer = Approvals(
            {
                "deploy": Review(allowed=("approve", "reject"), description="prod deploy"),
                "delete": True,
            }
        )
        with capture_events() as events:
            session, box, model, paused = await paused_session(
                layer,
                call("deploy", id="d1", service="web"),
                call("status", id="s1"),
                call("delete", id="x1", path="/tmp/a"),
            )
        try:
            assert paused.node == layer.name
            assert paused.message == "2 tool calls need review"
            listed = review_calls(paused.payload)
            assert listed is not None
            assert [thaw(c) for c in listed] == [
                {
                    "id": "d1",
                    "name": "deploy",
                    "arguments": {"service": "web"},
                    "description": "prod deploy",
                    "allowed": ["approve", "reject"],
                },
                {
                    "id": "x1",
                    "name": "delete",
                    "arguments": {"path": "/tmp/a"},
                    "description": (
                        "Review the call to 'delete' before it runs; arguments: "
                        '{"path": "/tmp/a"}'
                    ),
                    "allowed": ["approve", "edit", "reject", "respond"],
                },
            ]
            # the payload is plain JSON data: it survives a store
            assert json.loads(json.dumps(thaw(paused.payload))) == thaw(paused.payload)
            assert box.ran == []  # nothing of the batch ran before the review
            assert session.paused is paused.checkpoint
            requested = [e for e in events if isinstance(e, ReviewRequested)]
            assert [(e.tool_call_ids, e.tools) for e in requested] == [
                (("d1", "x1"), ("deploy", "delete"))
            ]
        finally:
            await session.__aexit__(None, None, None)

    async def test_no_reviewable_call_runs_without_a_pause(self) -> None:
        """Calls nobody reviews run straight away; the run never pauses."""
        box = Deploy()
        model = ScriptedModel([reply("", call("status", id="s1")), "fine"])
        agent = Agent(model=model, tools=box.tools, middleware=[Approvals("deploy")])
        async with Session(agent) as session:
            result = await session.run("how is it?")
        assert result.final_text == "fine"
        assert box.ran == [("status", {})]


class TestDecisions:
    """Approve, edit, reject and respond each do what the reviewer meant."""

    async def test_approve_runs_the_call_as_asked(self) -> None:
        """An approved call runs once with the model's own arguments."""
        session, box, model, paused = await paused_session(
            Approvals("deploy"), call("deploy", id="d1", service="web", replicas=2)
        )
        try:
            with capture_events() as events:
                result = await session.resume(paused.checkpoint, decisions={"d1": Approve()})
            assert result.final_text == "done"
            assert box.ran == [("deploy", {"service": "web", "replicas": 2})]
            assert results_by_id(result.messages)["d1"][0].content == "deployed web x2"
            decided = [(e.tool_call_id, e.decision) for e in events if isinstance(e, ReviewDecided)]
            assert decided == [("d1", "approve")]
            check_pairing(session.conversation_messages, allow_pending=False)
        finally:
            await session.__aexit__(None, None, None)

    async def test_edit_runs_new_arguments_and_history_shows_them(self) -> None:
        """An edited call runs with the reviewer's arguments; the model sees those."""
        session, box, model, paused = await paused_session(
            Approvals("deploy"), call("deploy", id="d1", service="web", replicas=20)
        )
        try:
            result = await session.resume(decisions={"d1": Edit({"service": "web", "replicas": 2})})
            assert box.ran == [("deploy", {"service": "web", "replicas": 2})]
            history = session.conversation_messages
            shown = last_calls(history)["d1"]
            assert thaw(shown.arguments) == {"service": "web", "replicas": 2}
            assistant = next(m for m in history if isinstance(m, AssistantMessage))
            assert thaw(assistant.metadata)["tinyctx"]["review"]["edited"] == {
                "d1": {"service": "web", "replicas": 20}
            }
            # the run's own record and the next model request agree with the history
            assert thaw(last_calls(result.messages)["d1"].arguments)["replicas"] == 2
            sent = last_calls(model.requests[-1].messages)["d1"]
            assert thaw(sent.arguments)["replicas"] == 2
            check_pairing(history, allow_pending=False)
        finally:
            await session.__aexit__(None, None, None)

    async def test_reject_with_a_message_tells_the_model(self) -> None:
        """A rejected call never runs; its error result carries the reviewer's message."""
        session, box, model, paused = await paused_session(
            Approvals("delete"), call("delete", id="x1", path="/etc/passwd")
        )
        try:
            await session.resume(decisions={"x1": Reject("never touch /etc")})
            assert box.ran == []
            (result,) = results_by_id(session.conversation_messages)["x1"]
            assert result.is_error
            assert result.content == (
                "Rejected by the reviewer: this call of 'delete' was not run. "
                "The reviewer said: never touch /etc"
            )
            assert result in model.requests[-1].messages
        finally:
            await session.__aexit__(None, None, None)

    async def test_reject_without_a_message(self) -> None:
        """A plain rejection still says, in words, that the call did not run."""
        session, box, model, paused = await paused_session(
            Approvals("delete"), call("delete", id="x1", path="/tmp/x")
        )
        try:
            await session.resume(decisions={"x1": Reject()})
            (result,) = results_by_id(session.conversation_messages)["x1"]
            assert result.content == "Rejected by the reviewer: this call of 'delete' was not run."
            assert box.ran == []
        finally:
            await session.__aexit__(None, None, None)

    async def test_respond_makes_the_humans_text_the_result(self) -> None:
        """A responded call never runs; the reviewer's text is the (non-error) result."""
        session, box, model, paused = await paused_session(
            Approvals("status"), call("status", id="s1")
        )
        try:
            await session.resume(decisions={"s1": Respond("I checked: it is down")})
            (result,) = results_by_id(session.conversation_messages)["s1"]
            assert (result.content, result.is_error) == ("I checked: it is down", False)
            assert box.ran == []
        finally:
            await session.__aexit__(None, None, None)

    async def test_mixed_decisions_in_one_batch_keep_the_call_order(self) -> None:
        """Approve, edit, reject, respond and an unreviewed call: one result each, in order."""
        session, box, model, paused = await paused_session(
            Approvals(["deploy", "delete"]),
            call("deploy", id="a", service="api"),
            call("delete", id="b", path="/tmp/1"),
            call("status", id="c"),
            call("deploy", id="d", service="db", replicas=5),
            call("delete", id="e", path="/tmp/2"),
        )
        try:
            await session.resume(
                decisions={
                    "a": Approve(),
                    "b": Reject("keep it"),
                    "d": Edit({"service": "db", "replicas": 1}),
                    "e": Respond("already gone"),
                }
            )
            history = session.conversation_messages
            check_pairing(history, allow_pending=False)
            results = [m for m in history if isinstance(m, ToolResult)]
            assert [r.tool_call_id for r in results] == ["a", "b", "c", "d", "e"]
            assert box.ran == [
                ("deploy", {"service": "api", "replicas": 1}),
                ("status", {}),
                ("deploy", {"service": "db", "replicas": 1}),
            ]
            assert [r.is_error for r in results] == [False, True, False, False, False]
        finally:
            await session.__aexit__(None, None, None)

    async def test_resume_in_a_new_session_from_the_checkpoint(self) -> None:
        """Another Session of the thread resumes the stored checkpoint with decisions."""
        session, box, model, paused = await paused_session(
            Approvals("deploy"), call("deploy", id="d1", service="web")
        )
        await session.__aexit__(None, None, None)
        agent = session.agent
        async with Session(agent, thread_id="review") as other:
            result = await other.resume(
                paused.checkpoint, decisions={"d1": Edit({"service": "w2"})}
            )
        assert result.final_text == "done"
        assert box.ran == [("deploy", {"service": "w2", "replicas": 1})]


class TestDurableDecisions:
    """Decisions are run state: they travel with a later checkpoint of the same run."""

    async def test_a_second_pause_keeps_the_decisions_for_another_session(self) -> None:
        """A tool pausing mid-batch after the review: a new session runs the approved rest."""
        box = Deploy()
        pause = FakeTool("pause", control=Interrupt("ops", "wait for the window"))
        model = ScriptedModel(
            [
                reply(
                    "",
                    call("deploy", id="a", service="api"),
                    call("pause", id="p"),
                    call("deploy", id="b", service="db", replicas=9),
                ),
                "rolled out",
            ]
        )
        agent = Agent(model=model, tools=[*box.tools, pause.tool], middleware=[Approvals("deploy")])
        async with Session(agent, thread_id="ops") as first:
            with pytest.raises(Interrupted) as review:
                await first.run("roll out")
            with pytest.raises(Interrupted) as window:
                await first.resume(
                    decisions={"a": Approve(), "b": Edit({"service": "db", "replicas": 2})}
                )
        assert window.value.node == "ops"
        assert [c.id for c in window.value.checkpoint.pending] == ["b"]
        encoded = json.dumps(thaw(window.value.checkpoint.state))  # plain JSON, storable
        assert '"edit"' in encoded
        async with Session(agent, thread_id="ops") as second:
            result = await second.resume(window.value.checkpoint)
            history = second.conversation_messages
        assert result.final_text == "rolled out"
        assert box.ran == [
            ("deploy", {"service": "api", "replicas": 1}),
            ("deploy", {"service": "db", "replicas": 2}),
        ]
        assert thaw(last_calls(history)["b"].arguments) == {"service": "db", "replicas": 2}
        check_pairing(history, allow_pending=False)
        assert review.value.checkpoint.run_id == result.run_id


class TestRefusedDecisions:
    """Bad decisions are refused before anything runs; the session stays paused."""

    @pytest.mark.parametrize(
        ("decisions", "expected"),
        [
            ({}, ["missing decision for call 'd1' (deploy)", "missing decision for call 'x1'"]),
            (
                {"d1": Approve(), "x1": Approve(), "zz": Approve()},
                ["decision for unknown call id 'zz'"],
            ),
            (
                {"d1": Respond("no"), "x1": Approve()},
                ["decision 'respond' is not allowed for call 'd1' (deploy); allowed: approve, "],
            ),
            (
                {"d1": Edit({"service": 3}), "x1": Approve()},
                ["edited arguments for call 'd1' fail the schema of 'deploy': 'service': "],
            ),
            (
                {"d1": Edit({"replicas": 2}), "x1": Approve()},
                ["missing required argument 'service'"],
            ),
        ],
    )
    async def test_each_problem_is_named_and_nothing_runs(
        self, decisions: dict[str, Any], expected: list[str]
    ) -> None:
        """A ResumeError lists each problem; a corrected resume then succeeds."""
        layer = Approvals({"deploy": Review(allowed=("approve", "edit", "reject")), "delete": True})
        session, box, model, paused = await paused_session(
            layer, call("deploy", id="d1", service="web"), call("delete", id="x1", path="/a")
        )
        try:
            before = session.conversation_messages
            with pytest.raises(ResumeError) as info:
                await session.resume(paused.checkpoint, decisions=decisions)
            text = str(info.value)
            for fragment in expected:
                assert fragment in text
            assert box.ran == []
            assert model.calls == 1
            assert session.paused is paused.checkpoint
            assert session.conversation_messages == before
            result = await session.resume(decisions={"d1": Approve(), "x1": Reject()})
            assert result.final_text == "done"
            assert box.ran == [("deploy", {"service": "web", "replicas": 1})]
        finally:
            await session.__aexit__(None, None, None)

    async def test_decisions_nobody_takes_are_refused(self) -> None:
        """Decisions for a pause no approval layer made are an error, not silently dropped."""
        pause = FakeTool("pause", control=Interrupt("elsewhere"))
        model = ScriptedModel([reply("", call("pause"), call("pause")), "x"])
        agent = Agent(model=model, tools=[pause.tool], middleware=[Approvals("deploy")])
        async with Session(agent) as session:
            with pytest.raises(Interrupted):
                await session.run("go")
            with pytest.raises(ResumeError, match="no layer takes decisions"):
                await session.resume(decisions={"c1": Approve()})
            assert session.paused is not None

    async def test_a_checkpoint_that_lost_its_payload_is_refused_clearly(self) -> None:
        """A review pause without its payload (a lossy store, handed to a fresh session)
        is named as the problem; the session holding the pause refuses the edited copy."""
        layer = Approvals("deploy")
        session, box, model, paused = await paused_session(
            layer, call("deploy", id="d1", service="web")
        )
        try:
            stripped = paused.checkpoint.evolve(payload=None)
            with pytest.raises(ResumeError, match="differs .* in payload"):
                await session.resume(stripped, decisions={"d1": Approve()})
            fresh = Session(
                Agent(model=model, tools=box.tools, middleware=[layer]), thread_id="review"
            )
            async with fresh:
                with pytest.raises(ResumeError, match="has no review payload"):
                    await fresh.resume(stripped, decisions={"d1": Approve()})
            assert box.ran == []
        finally:
            await session.__aexit__(None, None, None)

    async def test_bad_decision_values_are_type_errors(self) -> None:
        """Something that is not a Decision is refused with its key named."""
        session, box, model, paused = await paused_session(
            Approvals("deploy"), call("deploy", id="d1", service="web")
        )
        try:
            with pytest.raises(TypeError, match=r"decisions\['d1'\] must be Approve"):
                await session.resume(decisions={"d1": "yes"})  # type: ignore[dict-item]
            assert session.paused is paused.checkpoint
        finally:
            await session.__aexit__(None, None, None)

    async def test_calls_behind_another_pause_are_reviewed_when_it_resumes(self) -> None:
        """Another layer's pause wins the response; its resume pauses again for the review."""
        box = Deploy()
        first = reply(
            "", call("status", id="s"), call("delete", id="x", path="/"), control=Interrupt("other")
        )
        model = ScriptedModel([first, "ok"])
        agent = Agent(model=model, tools=box.tools, middleware=[Approvals("delete")])
        async with Session(agent) as session:
            with pytest.raises(Interrupted) as other:
                await session.run("go")
            assert other.value.node == "other"
            with pytest.raises(Interrupted) as review:
                await session.resume()
            assert review.value.node == "Approvals"
            assert [c["id"] for c in review_calls(review.value.payload) or ()] == ["x"]
            assert box.ran == []  # nothing of the batch ran before the review
            result = await session.resume(decisions={"x": Reject()})
            history = session.conversation_messages
        assert result.final_text == "ok"
        assert box.ran == [("status", {})]
        assert [r.tool_call_id for r in history if isinstance(r, ToolResult)] == ["s", "x"]
        check_pairing(history, allow_pending=False)

    async def test_a_stop_on_the_response_is_not_turned_into_a_pause(self) -> None:
        """A response that already ends the run is left alone: its calls never run anyway."""
        box = Deploy()
        model = ScriptedModel(
            [reply("", call("delete", id="x", path="/"), control=StopWithFinal("bye"))]
        )
        agent = Agent(model=model, tools=box.tools, middleware=[Approvals("delete")])
        async with Session(agent) as session:
            result = await session.run("go")
        assert (result.status, result.final_text, box.ran) == ("stopped", "bye", [])

    async def test_an_undecided_reviewable_call_never_runs(self) -> None:
        """On the tool onion alone, a call needing review without a decision is refused."""
        box = Deploy()
        ctx = quiet_context(tools=box.tools)
        result = await run_tool_layer(Approvals("delete"), call("delete", id="x", path="/"), ctx)
        assert result.is_error
        assert "needs human review and no decision was given" in result.content
        assert box.ran == []


class TestDecisionValues:
    """Decisions have a JSON form a review UI can post."""

    @pytest.mark.parametrize(
        "decision",
        [Approve(), Edit({"a": [1, {"b": None}]}), Reject(), Reject("why"), Respond("text")],
    )
    def test_round_trip(self, decision: Any) -> None:
        """to_json then decision_from_json gives the same decision."""
        document = json.loads(json.dumps(decision.to_json()))
        assert decision_from_json(document) == decision

    @pytest.mark.parametrize(
        ("document", "fragment"),
        [
            ({"type": "maybe"}, "decisions['c'].type: expected one of"),
            ({"type": "edit"}, "decisions['c'].arguments: expected an object"),
            ({"type": "respond", "text": 1}, "decisions['c'].text: expected a string"),
            ({"type": "approve", "extra": 1}, "unexpected field(s) ['extra']"),
        ],
    )
    def test_malformed_documents_name_the_path(self, document: Any, fragment: str) -> None:
        """A malformed posted decision is a ValueError naming where it is wrong."""
        with pytest.raises(ValueError) as info:
            decisions_from_json({"c": document})
        assert fragment in str(info.value)

    def test_interrupt_payload_must_be_json_data(self) -> None:
        """A payload that a store could not keep is refused when the Interrupt is made."""
        with pytest.raises(TypeError, match=r"payload\['x'\] must be JSON data"):
            Interrupt("n", payload={"x": object()})
        with pytest.raises(TypeError, match="finite"):
            Interrupt("n", payload=[float("nan")])


# ---------------------------------------------------------------------------------------
# property: any batch, any review configuration, any valid decisions

TOOLS = ("t0", "t1", "t2")


@st.composite
def review_setups(draw: st.DrawFn) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    batch = draw(
        st.lists(st.tuples(st.sampled_from(TOOLS), st.integers(0, 9)), min_size=1, max_size=6)
    )
    config: dict[str, Any] = {}
    for name in TOOLS:
        choice = draw(st.sampled_from(["none", "all", "even"]))
        if choice == "none":
            continue
        allowed = draw(
            st.lists(
                st.sampled_from(["approve", "edit", "reject", "respond"]),
                min_size=1,
                max_size=4,
                unique=True,
            )
        )
        when = (lambda c: c.arguments["n"] % 2 == 0) if choice == "even" else None
        config[name] = (Review(allowed=tuple(allowed), when=when), choice)
    return batch, config


# one pick per call a batch can hold (drawn with the batch, not inside the async test: a
# draw that overruns there raises hypothesis's StopTest through the event loop's runner)
_DECISION_PICKS = st.lists(
    st.tuples(
        st.integers(0, 3), st.integers(10, 99), st.none() | st.text(max_size=5), st.text(max_size=8)
    ),
    min_size=6,
    max_size=6,
)


class TestReviewProperty:
    """Whatever the batch, configuration and decisions, pairing and decisions hold."""

    @given(setup=review_setups(), picks=_DECISION_PICKS)
    async def test_every_call_gets_one_result_and_only_approved_ones_ran(
        self,
        setup: tuple[list[tuple[str, int]], dict[str, Any]],
        picks: list[tuple[int, int, str | None, str]],
    ) -> None:
        """Approved/edited calls ran once with the history's arguments; others never ran."""
        batch, config = setup
        fakes = {
            name: FakeTool(name, returns=lambda a: f"ran {a['n']}", parameters=INT_SCHEMA)
            for name in TOOLS
        }
        calls = [call(name, id=f"c{i}", n=n) for i, (name, n) in enumerate(batch)]
        layer = Approvals({name: review for name, (review, _) in config.items()} or {"t0": False})
        model = ScriptedModel([reply("", *calls), "finished"])
        agent = Agent(model=model, tools=[f.tool for f in fakes.values()], middleware=[layer])

        def reviewed(name: str, n: int) -> bool:
            if name not in config:
                return False
            return config[name][1] == "all" or n % 2 == 0

        expected_ids = [c.id for c, (name, n) in zip(calls, batch) if reviewed(name, n)]
        decisions: dict[str, Any] = {}
        async with Session(agent) as session:
            if not expected_ids:
                result = await session.run("go")
                assert result.final_text == "finished"
            else:
                with pytest.raises(Interrupted) as info:
                    await session.run("go")
                listed = review_calls(info.value.payload)
                assert listed is not None
                assert [c["id"] for c in listed] == expected_ids
                for entry, (which, n, reason, text) in zip(listed, picks, strict=False):
                    allowed = list(entry["allowed"])
                    kind = allowed[which % len(allowed)]
                    if kind == "approve":
                        decisions[entry["id"]] = Approve()
                    elif kind == "edit":
                        decisions[entry["id"]] = Edit({"n": n})
                    elif kind == "reject":
                        decisions[entry["id"]] = Reject(reason)
                    else:
                        decisions[entry["id"]] = Respond(text)
                await session.resume(info.value.checkpoint, decisions=decisions)
            history = session.conversation_messages
        check_pairing(history, allow_pending=False)
        results = results_by_id(history)
        assert sorted(results) == sorted(c.id for c in calls)
        assert all(len(r) == 1 for r in results.values())
        assert [r.tool_call_id for r in history if isinstance(r, ToolResult)] == [
            c.id for c in calls
        ]
        shown = last_calls(history)
        expected_runs: dict[str, list[int]] = {name: [] for name in TOOLS}
        for c in calls:
            decision = decisions.get(c.id)
            (result,) = results[c.id]
            if isinstance(decision, (Reject, Respond)):
                assert result.content != f"ran {c.arguments['n']}" or isinstance(decision, Respond)
                if isinstance(decision, Respond):
                    assert result.content == decision.text
                continue
            n = shown[c.id].arguments["n"]
            if isinstance(decision, Edit):
                assert n == decision.arguments["n"]
            else:
                assert n == c.arguments["n"]
            assert result.content == f"ran {n}"
            expected_runs[c.name].append(n)
        for name, fake in fakes.items():
            assert [a["n"] for a in fake.calls] == expected_runs[name]


class TestKernelPieces:
    """The public kernel pieces approvals are built on work for any layer."""

    def test_plain_tool_checks_its_schema_top_level(self) -> None:
        """Tool.check_arguments names missing, unknown and mistyped arguments."""
        plain = FakeTool("plain", parameters=INT_SCHEMA).tool
        plain.check_arguments({"n": 3})
        with pytest.raises(ToolArgumentError) as info:
            plain.check_arguments({"n": "3", "extra": True})
        assert info.value.problems == (
            "'n': expected integer, got '3'",
            "unexpected argument 'extra' (this tool takes: n)",
        )
        with pytest.raises(ToolArgumentError, match="missing required argument 'n'"):
            plain.check_arguments({})

    async def test_resume_without_a_pause_is_an_error(self) -> None:
        """resume() with no checkpoint needs a paused session."""
        async with Session(Agent(model=ScriptedModel(["x"]))) as session:
            with pytest.raises(InvalidCheckpoint, match="has no paused run to resume"):
                await session.resume()

    async def test_a_user_layer_can_take_decisions(self) -> None:
        """on_resume sees the decisions first; a layer that raises keeps the session paused."""
        seen: list[tuple[str, dict[str, Any]]] = []

        class Gate(Layer):
            async def on_resume(self, ctx: Any, checkpoint: Any, decisions: Any) -> bool:
                seen.append((checkpoint.node, dict(decisions)))
                if "veto" in decisions:
                    raise ResumeError(["vetoed"])
                return True

        pause = FakeTool("pause", control=Interrupt("gate", payload={"ask": ["a", 1]}))
        model = ScriptedModel([reply("", call("pause", id="p1")), "after"])
        agent = Agent(model=model, tools=[pause.tool], middleware=[Gate()])
        async with Session(agent) as session:
            with pytest.raises(Interrupted) as info:
                await session.run("go")
            assert thaw(info.value.payload) == {"ask": ["a", 1]}
            with pytest.raises(ResumeError, match="vetoed"):
                await session.resume(decisions={"veto": Reject()})
            assert session.paused is info.value.checkpoint
            result = await session.resume(decisions={"p1": Approve()})
        assert result.final_text == "after"
        assert seen == [("gate", {"veto": Reject()}), ("gate", {"p1": Approve()})]
