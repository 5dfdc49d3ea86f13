"""Session(store=...): a thread loaded on entering and written as it is committed."""

from __future__ import annotations

import datetime
import gc
import weakref
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    AssistantMessage,
    ConfigError,
    Interrupt,
    Interrupted,
    Layer,
    MemoryStore,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunCancelled,
    RunConfig,
    RunContext,
    Session,
    SessionBusy,
    SqliteStore,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.codec import (
    CodecError,
    decode_checkpoint,
    decode_messages,
    decode_state,
    encode_messages,
)
from tinyctx.messages import check_pairing
from tinyctx.middleware import CallLimits, Microcompact
from tinyctx.testing import FakeTool, ScriptedModel, call, capture_events, reply
from tinyctx.testing.strategies import histories
from tinyctx.threads import (
    FencedOut,
    LeaseHeld,
    StaleThreadVersion,
    ThreadRecord,
    ThreadWrite,
)


class SpyStore(MemoryStore):
    """A MemoryStore that remembers every write (to see what a step costs)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[ThreadWrite] = []

    async def write(self, thread_id: str, change: ThreadWrite, **kwargs: Any) -> int:
        version: int = await super().write(thread_id, change, **kwargs)
        self.writes.append(change)
        return version


class Gate(Layer):
    """Pauses for approval whenever the model asks for ``deploy``."""

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request, ctx)
        if any(c.name == "deploy" for c in response.message.tool_calls):
            ctx.request_control(Interrupt("approval", "deploy?"))
        return response


async def stored(store: MemoryStore, thread: str) -> tuple[ThreadRecord, tuple[Message, ...]]:
    record = await store.load_thread(thread)
    return record, decode_messages(record.messages)


class TestLoadAndWrite:
    """A thread survives its session: a later session continues it."""

    async def test_entering_reports_what_was_loaded_and_how_long_it_took(self) -> None:
        """thread.loaded carries the version, the message count, the owner and the seconds
        the lease, read and decode took (what a request pays to load its thread)."""
        store = MemoryStore()
        agent = Agent(model=ScriptedModel(["one"]))
        async with Session(agent, thread_id="l", store=store) as session:
            await session.run("hi")
        with capture_events("thread.loaded") as events:
            async with Session(agent, thread_id="l", store=store, owner="w2"):
                pass
        (loaded,) = events
        version = (await store.load_thread("l")).version
        assert (loaded.version, loaded.messages, loaded.owner) == (version, 2, "w2")  # type: ignore[attr-defined]
        assert 0 < loaded.seconds < 5  # type: ignore[attr-defined]

    async def test_a_closed_session_frees_its_thread_at_once(self, tmp_path: Any) -> None:
        """No reference cycle keeps a closed session's context and conversation (its whole
        loaded thread) alive until the cyclic collector comes by: a server running one
        session per request would otherwise hold every request's thread and pay for a
        collection over it."""
        store = SqliteStore(tmp_path / "t.db")
        agent = Agent(
            model=ScriptedModel([reply("", call("t")), "done"]), tools=[FakeTool("t").tool]
        )
        async with Session(agent, thread_id="free", store=store) as session:
            await session.run("hi")
        gc.collect()
        gc.disable()
        try:
            async with Session(agent, thread_id="free", store=store) as session:
                assert len(session.conversation_messages) == 4
                ref = weakref.ref(session.ctx)  # it holds the conversation
            del session
            assert ref() is None
        finally:
            gc.enable()
            await store.aclose()

    async def test_a_new_session_continues_the_thread(self) -> None:
        """Messages written by one session are loaded by the next one of the thread."""
        store = MemoryStore()
        model = ScriptedModel([reply("", call("t")), "first", "second"])
        agent = Agent(model=model, tools=[FakeTool("t").tool])
        async with Session(agent, thread_id="ops", store=store) as first:
            await first.run("hello")
            history = first.conversation_messages
        async with Session(agent, thread_id="ops", store=store) as second:
            assert second.conversation_messages == history
            assert second.thread_version == (await store.load_thread("ops")).version
            await second.run("again")
        _, messages = await stored(store, "ops")
        assert [m.text for m in messages[-2:]] == ["again", "second"]
        assert model.requests[-1].messages[: len(history)] == history

    async def test_each_message_is_durable_before_the_next_model_call(self) -> None:
        """At every model call the store already holds exactly the request's history."""
        store = MemoryStore()
        seen: list[bool] = []

        async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            _, messages = await stored(store, "d")
            seen.append(messages == request.messages)
            if len(seen) < 3:
                return reply("", call("t"), call("t"))
            return reply("done")

        agent = Agent(model=model, tools=[FakeTool("t").tool])
        async with Session(agent, thread_id="d", store=store) as session:
            await session.run("go")
        assert seen == [True, True, True]

    async def test_a_step_writes_only_its_new_messages(self) -> None:
        """Per write, only the messages appended since the last one are encoded."""
        store = SpyStore()
        model = ScriptedModel([reply("", call("t")), reply("", call("t")), "done"])
        agent = Agent(model=model, tools=[FakeTool("t").tool])
        async with Session(agent, thread_id="w", store=store) as session:
            await session.run("go")
        appended = [m for w in store.writes for m in w.append]
        _, messages = await stored(store, "w")
        assert len(appended) == len(messages) == 6  # each message written once
        assert all(w.compaction is None for w in store.writes)

    async def test_a_persisted_compaction_is_recorded_as_a_range(self) -> None:
        """Microcompact's persisted rewrite is a Compaction of the cleared range, archived."""
        store = SpyStore()
        script = [reply("", call("read", id=f"r{i}")) for i in range(4)] + ["done"]
        agent = Agent(
            model=ScriptedModel(script),
            tools=[FakeTool("read", returns="x" * 400).tool],
            middleware=[Microcompact(keep_recent=2)],
        )
        async with Session(agent, thread_id="c", store=store) as session:
            await session.run("read four times")
            history = session.conversation_messages
        compactions = [w.compaction for w in store.writes if w.compaction is not None]
        assert compactions
        for compaction in compactions:
            assert compaction.end - compaction.start == len(compaction.replacement) == 1
        record, messages = await stored(store, "c")
        assert messages == history
        archive = await store.archived("c")
        assert [len(a.messages) for a in archive] == [1] * len(compactions)

    async def test_layer_state_is_written_and_restored(self) -> None:
        """A thread-scope limit holds across sessions through the stored layer state."""
        store = MemoryStore()
        model = ScriptedModel(["one", "two", "never"])
        limits = CallLimits(model_calls=2, scope="thread", exit="end")
        agent = Agent(model=model, middleware=[limits])
        for text in ("a", "b"):
            async with Session(agent, thread_id="lim", store=store) as session:
                await session.run(text)
        record = await store.load_thread("lim")
        assert record.state is not None
        assert decode_state(record.state)["CallLimits"]["model"] == 2
        async with Session(agent, thread_id="lim", store=store) as session:
            result = await session.run("c")
        assert result.status == "stopped"
        assert model.calls == 2

    async def test_sessions_without_a_store_do_not_write(self) -> None:
        """Without store= nothing is loaded or written (the store-less path is unchanged)."""
        store = SpyStore()
        model = ScriptedModel(["one"])
        async with Session(Agent(model=model), thread_id="x") as session:
            await session.run("a")
            assert session.thread_version is None
        assert store.writes == []

    def test_bad_settings_are_config_errors(self) -> None:
        """A non-store, a bad lease TTL or owner fail at construction naming the field."""
        agent = Agent(model=ScriptedModel([]))
        with pytest.raises(ConfigError, match="Session.store"):
            Session(agent, store=object())  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="Session.lease_ttl"):
            Session(agent, store=MemoryStore(), lease_ttl=0)
        with pytest.raises(ConfigError, match="Session.owner"):
            Session(agent, store=MemoryStore(), owner="")

    @settings(max_examples=25)
    @given(history=histories(max_turns=6), cut=st.integers(0, 6), text=st.text(max_size=20))
    async def test_any_thread_reloads_equal(
        self, history: tuple[Message, ...], cut: int, text: str
    ) -> None:
        """A thread written with compactions and layer state reloads equal to memory."""
        store = MemoryStore()
        agent = Agent(model=ScriptedModel([]), middleware=[CallLimits(model_calls=3)])
        async with Session(agent, thread_id="p", store=store) as session:
            conversation = session.ctx.conversation
            for message in history:
                await conversation.append(message)
            await session._sync()
            start = min(cut, len(history))
            if start < len(history) and not isinstance(history[start], ToolResult):
                kept = list(conversation.messages)
                kept[start] = kept[start].evolve(metadata={"edited": text})
                conversation.replace(kept, emit_new=False)
            session.ctx.thread_state("note", lambda: _Note(text))
            await session._sync()
            expected = session.conversation_messages
            state = session.ctx.conversation.layer_state.dump()
        async with Session(agent, thread_id="p", store=store) as again:
            assert again.conversation_messages == expected
            assert again.ctx.conversation.layer_state.dump() == state


class _Note:
    def __init__(self, text: str) -> None:
        self.text = text

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text}


class TestInterruptsAndResume:
    """A pause is stored with its messages; any later session resumes it."""

    async def test_the_checkpoint_is_written_with_its_messages(self) -> None:
        """One write carries the step's messages and the checkpoint."""
        store = SpyStore()
        model = ScriptedModel([reply("", call("deploy")), "shipped"])
        agent = Agent(model=model, tools=[FakeTool("deploy").tool], middleware=[Gate()])
        async with Session(agent, thread_id="a", store=store) as session:
            with pytest.raises(Interrupted):
                await session.run("ship it")
        pausing = [w for w in store.writes if isinstance(w.checkpoint, str)]
        assert len(pausing) == 1
        record, messages = await stored(store, "a")
        assert record.checkpoint is not None
        checkpoint = decode_checkpoint(record.checkpoint)
        assert checkpoint.messages == messages
        assert [c.name for c in checkpoint.pending] == ["deploy"]

    async def test_resume_without_an_argument_continues_the_stored_run(self) -> None:
        """A new session's resume() continues the stored pause; the checkpoint is cleared."""
        store = MemoryStore()
        deploy = FakeTool("deploy", returns="deployed")
        model = ScriptedModel([reply("", call("deploy")), "shipped"])
        agent = Agent(model=model, tools=[deploy.tool], middleware=[Gate()])
        async with Session(agent, thread_id="r", store=store) as first:
            with pytest.raises(Interrupted) as info:
                await first.run("ship it")
        async with Session(agent, thread_id="r", store=store) as second:
            assert second.paused is not None
            assert second.paused.run_id == info.value.checkpoint.run_id
            result = await second.resume()
        assert result.final_text == "shipped"
        assert len(deploy.calls) == 1
        record, messages = await stored(store, "r")
        assert record.checkpoint is None
        check_pairing(messages, allow_pending=False)

    async def test_a_failed_resume_keeps_the_stored_checkpoint(self) -> None:
        """#15 D1 with a store: the stored checkpoint is intact after a failed resume."""

        class Flaky(Layer):
            armed = False

            async def on_run_start(self, ctx: RunContext[Any]) -> None:
                if self.armed:
                    raise RuntimeError("store of notes down")

        flaky = Flaky()
        store = MemoryStore()
        model = ScriptedModel([reply("", call("deploy")), "shipped"])
        agent = Agent(model=model, tools=[FakeTool("deploy").tool], middleware=[flaky, Gate()])
        async with Session(agent, thread_id="f", store=store) as first:
            with pytest.raises(Interrupted):
                await first.run("ship it")
        before = await store.load_thread("f")
        flaky.armed = True
        async with Session(agent, thread_id="f", store=store) as second:
            with pytest.raises(RuntimeError):
                await second.resume()
        after = await store.load_thread("f")
        assert after.checkpoint == before.checkpoint
        assert after.messages == before.messages

    async def test_a_new_run_abandons_the_stored_pause(self) -> None:
        """run() on a paused thread answers the pending calls and clears the checkpoint."""
        store = MemoryStore()
        model = ScriptedModel([reply("", call("deploy")), "fresh"])
        agent = Agent(model=model, tools=[FakeTool("deploy").tool], middleware=[Gate()])
        async with Session(agent, thread_id="n", store=store) as first:
            with pytest.raises(Interrupted):
                await first.run("ship it")
        async with Session(agent, thread_id="n", store=store) as second:
            await second.run("never mind")
        record, messages = await stored(store, "n")
        assert record.checkpoint is None
        check_pairing(messages, allow_pending=False)


class TestLeases:
    """One writer per thread: a second session is refused while the first is open."""

    async def test_a_second_session_gets_session_busy(self) -> None:
        """LeaseHeld (a SessionBusy) names the thread and the owner."""
        store = MemoryStore()
        agent = Agent(model=ScriptedModel([]))
        async with Session(agent, thread_id="busy", store=store, owner="worker-1"):
            other = Session(agent, thread_id="busy", store=store, owner="worker-2")
            with pytest.raises(SessionBusy, match="'busy'.*'worker-1'") as info:
                await other.__aenter__()
            assert isinstance(info.value, LeaseHeld)
        async with Session(agent, thread_id="busy", store=store, owner="worker-2"):
            pass  # released when the first session left

    async def test_the_lease_is_renewed_during_a_long_run(self) -> None:
        """A run longer than the TTL keeps the thread: a rival is refused mid-run."""
        store = MemoryStore()
        refused: list[str] = []

        async def slow(arguments: Any) -> str:
            await anyio.sleep(0.6)
            try:
                await Session(agent, thread_id="long", store=store).__aenter__()
            except LeaseHeld as exc:
                refused.append(exc.owner)
            return "slow done"

        model = ScriptedModel([reply("", call("slow")), "done"])
        agent = Agent(model=model, tools=[FakeTool("slow", returns=slow).tool])
        async with Session(agent, thread_id="long", store=store, owner="me", lease_ttl=0.2) as s:
            await s.run("go")
        assert refused == ["me"]

    async def test_a_dead_workers_lease_expires_after_its_ttl(self) -> None:
        """A lease nobody renews stops blocking the thread once its TTL has passed."""
        store = MemoryStore()
        await store.acquire_lease("orphan", "dead-worker", 0.2)
        agent = Agent(model=ScriptedModel(["hi"]))
        with pytest.raises(LeaseHeld, match="dead-worker"):
            await Session(agent, thread_id="orphan", store=store).__aenter__()
        await anyio.sleep(0.3)
        async with Session(agent, thread_id="orphan", store=store) as session:
            assert (await session.run("hello")).final_text == "hi"

    async def test_a_stale_write_is_refused_never_overwritten(self) -> None:
        """Another writer moving the thread makes the next write fail clearly."""
        store = MemoryStore()
        model = ScriptedModel(["one", "two"])
        agent = Agent(model=model)
        with pytest.raises(StaleThreadVersion, match="'stale'"):
            async with Session(agent, thread_id="stale", store=store) as session:
                await session.run("a")
                version = (await store.load_thread("stale")).version
                intruder = ThreadWrite(append=encode_messages([UserMessage("intruder")]))
                await store.write("stale", intruder, expected_version=version)
                await session.run("b")
        _, messages = await stored(store, "stale")
        assert messages[-1] == UserMessage("intruder")


class FlakyStore(MemoryStore):
    """A MemoryStore whose lease renewals and releases fail while an error is set."""

    def __init__(self) -> None:
        super().__init__()
        self.renew_error: Exception | None = None
        self.release_error: Exception | None = None
        self.write_error: Exception | None = None

    async def write(self, thread_id: str, change: ThreadWrite, **kwargs: Any) -> int:
        if self.write_error is not None:
            raise self.write_error
        version: int = await super().write(thread_id, change, **kwargs)
        return version

    async def renew_lease(self, lease: Any, ttl: float) -> Any:
        if self.renew_error is not None:
            raise self.renew_error
        return await super().renew_lease(lease, ttl)

    async def release_lease(self, lease: Any) -> None:
        if self.release_error is not None:
            raise self.release_error
        await super().release_lease(lease)


class TestLeaseAndStoreFailures:
    """What a worker sees when its store misbehaves: nothing lost, nothing half-written."""

    async def test_a_renewal_hiccup_is_reported_and_a_lost_lease_refuses_the_next_write(
        self,
    ) -> None:
        """Failed renewals are reported and retried; once another worker has taken the
        expired lease, the session learns it lost the thread and its next write is fenced
        out, leaving the other worker's messages untouched."""
        store = FlakyStore()
        store.renew_error = ConnectionError("store unreachable")
        mine = Agent(model=ScriptedModel(["never sent"]))
        theirs = Agent(model=ScriptedModel(["theirs"]))
        late: list[BaseException] = []
        with capture_events("thread.lease_renew_failed") as events:
            # leaving writes what is left ("late"): refused too, and said so
            with pytest.raises(FencedOut):
                async with Session(mine, thread_id="t", store=store, owner="a", lease_ttl=0.3) as a:
                    await anyio.sleep(0.5)  # renewals fail; the lease expires at 0.3 s
                    assert events and not any(e.lost for e in events)  # type: ignore[attr-defined]
                    assert "ConnectionError: store unreachable" in events[0].error  # type: ignore[attr-defined]
                    async with Session(theirs, thread_id="t", store=store, owner="b") as b:
                        await b.run("mine now")
                        store.renew_error = None
                        for _ in range(250):  # the next renewal finds the lease taken
                            if any(e.lost for e in events):  # type: ignore[attr-defined]
                                break
                            await anyio.sleep(0.02)
                        try:
                            await a.run("late")
                        except FencedOut as exc:
                            late.append(exc)
        assert any(e.lost for e in events)  # type: ignore[attr-defined]
        assert len(late) == 1 and "lease token 2 is current" in str(late[0])
        _, messages = await stored(store, "t")
        assert [m.text for m in messages] == ["mine now", "theirs"]

    async def test_a_thread_that_cannot_be_decoded_fails_clearly_and_frees_the_lease(
        self,
    ) -> None:
        """A stored document the codec refuses fails the session's entry naming the message,
        and the lease is released at once: no worker waits out a TTL for a broken thread."""
        store = MemoryStore()
        broken = ThreadWrite(append=(*encode_messages([UserMessage("fine")]), '{"v": 1}'))
        await store.write("bad", broken, expected_version=0)
        agent = Agent(model=ScriptedModel([]))
        with pytest.raises(CodecError, match=r"messages\[1\]"):
            async with Session(agent, thread_id="bad", store=store, owner="a", lease_ttl=60):
                pass
        lease = await store.acquire_lease("bad", "b", 60)  # not LeaseHeld
        assert lease.owner == "b"
        assert (await store.load_thread("bad")).version == 1  # nothing written

    async def test_a_store_outage_loses_nothing_and_the_next_write_catches_up(self) -> None:
        """A write that fails before the model call fails the run with the store's error
        and sends nothing; the input stays in the session, and the next write (here a
        run(None) that continues) stores it exactly once. A write failing after the model
        answered keeps the answer the same way."""
        store = FlakyStore()
        model = ScriptedModel(["first answer", "second answer"])
        async with Session(Agent(model=model), thread_id="o", store=store) as session:
            store.write_error = ConnectionError("store unreachable")
            with pytest.raises(ConnectionError):
                await session.run("hello")
            assert model.requests == []  # nothing is sent before it is durable
            assert [m.text for m in session.conversation_messages] == ["hello"]
            store.write_error = None
            assert (await session.run(None)).final_text == "first answer"
            _, messages = await stored(store, "o")
            assert [m.text for m in messages] == ["hello", "first answer"]

            class FailAfterAnswer(Layer):
                async def wrap_model(
                    self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
                ) -> ModelResponse:
                    response = await call_next(request, ctx)
                    store.write_error = ConnectionError("store unreachable")
                    return response

        agent = Agent(model=ScriptedModel(["kept"]), middleware=[FailAfterAnswer()])
        with pytest.raises(ConnectionError):  # leaving cannot write either: said so
            async with Session(agent, thread_id="o2", store=store) as session:
                await session.run("question")
        store.write_error = None
        _, messages = await stored(store, "o2")
        assert [m.text for m in messages] == ["question"]  # what was durable before

    @pytest.mark.parametrize(
        "lost_reply",
        [ConnectionError("reply lost"), StaleThreadVersion("t", 1, 2)],
        ids=["connection-dropped", "driver-retried"],
    )
    async def test_a_write_whose_reply_was_lost_is_found_landed(
        self, lost_reply: Exception
    ) -> None:
        """A write that committed but whose reply never came (the connection dropped, or
        the driver retried it and the retry was refused as stale) is found in the store:
        the session goes on at the new version, with nothing written twice."""

        class ReplyLost(MemoryStore):
            lose_next = False

            async def write(self, thread_id: str, change: ThreadWrite, **kwargs: Any) -> int:
                version: int = await super().write(thread_id, change, **kwargs)
                if self.lose_next:
                    self.lose_next = False
                    raise lost_reply
                return version

        store = ReplyLost()
        model = ScriptedModel(["one", "two"])
        async with Session(Agent(model=model), thread_id="t", store=store) as session:
            store.lose_next = True  # the write before the first model call
            assert (await session.run("first")).final_text == "one"
            assert (await session.run("second")).final_text == "two"
            assert session.thread_version == (await store.load_thread("t")).version
        _, messages = await stored(store, "t")
        assert [m.text for m in messages] == ["first", "one", "second", "two"]

    async def test_a_write_that_did_not_land_still_fails(self) -> None:
        """When the store does not hold the write (another writer moved the thread), the
        write's own error stands."""

        class Moved(MemoryStore):
            async def write(self, thread_id: str, change: ThreadWrite, **kwargs: Any) -> int:
                if kwargs.get("lease") is not None and change.append:
                    other = ThreadWrite(append=encode_messages([UserMessage("other")]))
                    current = (await self.load_thread(thread_id)).version
                    await super().write(thread_id, other, expected_version=current)
                version: int = await super().write(thread_id, change, **kwargs)
                return version

        agent = Agent(model=ScriptedModel(["never"]))
        with pytest.raises(StaleThreadVersion):
            async with Session(agent, thread_id="m", store=Moved()) as session:
                await session.run("mine")

    async def test_a_failed_lease_release_is_reported_not_raised(self) -> None:
        """The session's work is durable when its lease cannot be released (the lease then
        expires by itself): leaving reports the failure instead of raising it."""
        store = FlakyStore()
        store.release_error = ConnectionError("store unreachable")
        agent = Agent(model=ScriptedModel(["kept"]))
        with capture_events("events.subscriber_failed") as events:
            async with Session(agent, thread_id="r", store=store, lease_ttl=0.2) as session:
                await session.run("hello")
        assert [e.subscriber for e in events] == ["lease"]  # type: ignore[attr-defined]
        _, messages = await stored(store, "r")
        assert [m.text for m in messages] == ["hello", "kept"]
        store.release_error = None
        await anyio.sleep(0.3)  # the unreleased lease expires by itself
        async with Session(agent, thread_id="r", store=store):
            pass


class TestWhatAStoreCannotKeep:
    """Input a store cannot keep is refused before it is appended, so it never makes every
    later write of the session fail."""

    async def test_input_with_metadata_that_is_not_json_is_refused_up_front(self) -> None:
        """CodecError names input[i] and the field; nothing is appended or sent, and the
        session goes on."""
        store = MemoryStore()
        model = ScriptedModel(["answered"])
        async with Session(Agent(model=model), thread_id="m", store=store) as session:
            bad = UserMessage("when?", metadata={"when": datetime.date(2026, 1, 1)})
            with pytest.raises(CodecError, match=r"input\[1\]\.metadata\.when: a date"):
                await session.run([UserMessage("fine"), bad])
            assert session.conversation_messages == ()
            assert model.requests == []
            assert (await session.run("hello")).final_text == "answered"
        _, messages = await stored(store, "m")
        assert [m.text for m in messages] == ["hello", "answered"]

    async def test_without_a_store_metadata_need_not_be_json(self) -> None:
        """Only a store needs JSON: an in-memory session keeps any metadata."""
        model = ScriptedModel(["ok"])
        when = datetime.date(2026, 1, 1)
        async with Session(Agent(model=model)) as session:
            await session.run(UserMessage("x", metadata={"when": when}))
            assert session.conversation_messages[0].metadata["when"] == when

    async def test_a_layer_message_the_store_cannot_keep_is_named_by_its_place(self) -> None:
        """A message a layer added that the codec refuses fails the write naming its index
        in the conversation (not in the write's batch)."""

        class Tagger(Layer):
            async def wrap_model(
                self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
            ) -> ModelResponse:
                if len(ctx.conversation) > 2:
                    ctx.conversation.add(UserMessage("note", metadata={"raw": b"bytes"}))
                return await call_next(request, ctx)

        store = MemoryStore()
        agent = Agent(model=ScriptedModel(["one", "two"]), middleware=[Tagger()])
        with pytest.raises(CodecError, match=r"conversation\[3\]\.metadata\.raw"):
            async with Session(agent, thread_id="l", store=store) as session:
                await session.run("first")
                await session.run("second")
        _, messages = await stored(store, "l")
        assert [m.text for m in messages] == ["first", "one", "second"]


class TestAbandonedSteps:
    """A step a dead worker left open is continued or closed, pairing intact."""

    async def _abandoned(self, store: MemoryStore) -> None:
        calls = (ToolCall("c1", "t"), ToolCall("c2", "t"))
        log = [UserMessage("go"), AssistantMessage("", calls), ToolResult("c1", "t", "ok")]
        await store.write("dead", ThreadWrite(append=encode_messages(log)), expected_version=0)

    @pytest.mark.parametrize("mode", ["continue", "close"])
    async def test_recover(self, mode: str) -> None:
        """recover() answers the open call (by running it, or saying the worker stopped)."""
        store = MemoryStore()
        await self._abandoned(store)
        tool = FakeTool("t", returns="ran again")
        agent = Agent(model=ScriptedModel(["after"]), tools=[tool.tool])
        async with Session(agent, thread_id="dead", store=store) as session:
            assert [c.id for c in session.abandoned] == ["c2"]
            result = await session.recover(mode)  # type: ignore[arg-type]
            assert session.abandoned == ()
        _, messages = await stored(store, "dead")
        check_pairing(messages, allow_pending=False)
        if mode == "continue":
            assert result is not None and result.final_text == "after"
            assert len(tool.calls) == 1
        else:
            assert result is None
            assert tool.calls == []
            assert "may or may not have run" in messages[-1].text

    async def test_a_new_run_closes_an_abandoned_step(self) -> None:
        """run() on a thread with an abandoned step answers it before the new input."""
        store = MemoryStore()
        await self._abandoned(store)
        model = ScriptedModel(["fresh"])
        agent = Agent(model=model, tools=[FakeTool("t").tool])
        async with Session(agent, thread_id="dead", store=store) as session:
            await session.run("hello again")
        check_pairing(model.requests[0].messages, allow_pending=False)

    async def test_recover_without_an_abandoned_step_is_an_error(self) -> None:
        """recover() on a clean thread says so; a bad mode is a ConfigError."""
        async with Session(Agent(model=ScriptedModel([])), store=MemoryStore()) as session:
            with pytest.raises(ConfigError, match="mode"):
                await session.recover("retry")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="no abandoned step"):
                await session.recover("close")


class TestExceptionPathWithAStore:
    """Synthetic results of a run the caller cancelled are in the store."""

    async def test_caller_cancel_persists_synthetic_results(self) -> None:
        """A cancel scope around the session: the stored thread keeps pairing."""
        store = MemoryStore()
        with anyio.CancelScope() as scope:

            async def cancel_caller(arguments: Any) -> str:
                scope.cancel()
                await anyio.sleep_forever()
                return "never"

            model = ScriptedModel([reply("", call("slow"), call("slow"))])
            agent = Agent(model=model, tools=[FakeTool("slow", returns=cancel_caller).tool])
            async with Session(agent, thread_id="cx", store=store) as session:
                await session.run("go")
        _, messages = await stored(store, "cx")
        check_pairing(messages, allow_pending=False)
        assert len(messages) == 4

    async def test_uncaught_run_cancelled_persists_and_releases(self) -> None:
        """RunCancelled leaving the block: results stored, lease released for the next."""
        store = MemoryStore()

        async def give_up(arguments: Any) -> str:
            raise RunCancelled("in_tool", "stop")

        model = ScriptedModel([reply("", call("t"))])
        agent = Agent(model=model, tools=[FakeTool("t", returns=give_up).tool])
        with capture_events() as events, pytest.raises(RunCancelled):
            async with Session(agent, thread_id="rc", store=store) as session:
                await session.run("go")
        _, messages = await stored(store, "rc")
        check_pairing(messages, allow_pending=False)
        assert not [e for e in events if e.kind == "thread.write_failed"]
        async with Session(agent, thread_id="rc", store=store):
            pass


class TestConfigViewNotStored:
    """#15 D11: a stored checkpoint never holds a field the view policy excluded."""

    async def test_excluded_field_not_in_the_stored_checkpoint(self) -> None:
        """The encoded checkpoint has no trace of the excluded secret."""
        from tinyctx.middleware import ContextPolicy, Inherit
        from tinyctx.middleware.context_view import VIEW_GLOBAL_KEY

        store = MemoryStore()
        config = RunConfig(
            thread_id="secret",
            configurable={VIEW_GLOBAL_KEY: {"work_dir": "/w", "api_key": "sk-do-not-store"}},
        )
        model = ScriptedModel([reply("", call("deploy")), "ok"])
        agent = Agent(
            model=model,
            tools=[FakeTool("deploy").tool],
            middleware=[Inherit(view=ContextPolicy(exclude=("extra.api_key",))), Gate()],
        )
        async with Session(agent, config=config, store=store) as session:
            with pytest.raises(Interrupted):
                await session.run("go")
        record = await store.load_thread("secret")
        assert record.checkpoint is not None
        assert "sk-do-not-store" not in record.checkpoint
        assert "/w" in record.checkpoint


class TestSessionMemoryAcrossSessions:
    """Session memory's counters and pending work continue in the thread's next session."""

    async def test_an_extraction_cut_short_runs_in_the_next_session(self) -> None:
        """An extraction cancelled at session end is started by the next session's run."""
        from tinyctx.middleware import SessionMemory
        from tinyctx.middleware.extractors import ExtractionJob

        class Slow:
            def __init__(self, hang: bool) -> None:
                self.hang = hang
                self.jobs: list[int] = []

            async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> list[str]:
                self.jobs.append(len(job.new_messages))
                if self.hang:
                    await anyio.sleep_forever()
                return ["prefers tea"]

        store = MemoryStore()
        model = ScriptedModel(["noted", "sure"])

        def agent(extractor: Slow, min_turns: int) -> Agent:
            memory = SessionMemory(
                extractor, store=store, min_tokens=0, min_tool_calls=0, min_turns=min_turns
            )
            return Agent(model=model, middleware=[memory])

        hanging = Slow(hang=True)
        async with Session(agent(hanging, 1), thread_id="m", store=store, grace_period=0.05) as s:
            await s.run("I prefer tea.")
        assert hanging.jobs == [2]
        state = decode_state((await store.load_thread("m")).state or "")
        assert state["SessionMemory"]["pending"] is True
        working = Slow(hang=False)
        async with Session(agent(working, 50), thread_id="m", store=store) as s:
            await s.run("Hello again.")
        assert working.jobs  # pending work ran although min_turns is not reached
        notes = await store.notes("session_memory:thread:m")
        assert [n.text for n in notes] == ["prefers tea"]
        state = decode_state((await store.load_thread("m")).state or "")
        assert state["SessionMemory"]["pending"] is False
        assert state["SessionMemory"]["counters"]["extractions"] == 1


class TestNotesFencedByTheThreadLease:
    """A layer reads its session's thread lease; SessionMemory's notes are fenced by it."""

    async def test_thread_lease_is_the_sessions_lease_and_none_without_a_store(self) -> None:
        """ctx.thread_lease() is the lease the session holds (renewals included), None
        without a store and None in a context of another thread."""
        seen: list[Any] = []

        class Reader(Layer):
            async def on_run_start(self, ctx: RunContext[Any]) -> None:
                seen.append(ctx.thread_lease())
                seen.append(ctx.derive(thread_id="elsewhere").thread_lease())

        store = MemoryStore()
        agent = Agent(model=ScriptedModel(["a", "b"]), middleware=[Reader()])
        async with Session(agent, thread_id="lz", store=store, owner="w1") as session:
            await session.run("hi")
            lease = (await store.load_thread("lz")).lease
        assert lease is not None and seen == [lease, None]
        seen.clear()
        async with Session(agent, thread_id="lz") as session:
            await session.run("again")
        assert seen == [None, None]

    async def test_an_extraction_after_the_thread_was_taken_writes_no_note(self) -> None:
        """An extraction whose worker lost the thread meanwhile fails (FencedOut, reported
        as MemoryExtractionFailed), writes no note and leaves the marks; the run is not hurt."""
        from tinyctx.middleware import SessionMemory
        from tinyctx.middleware.extractors import ExtractionJob
        from tinyctx.middleware.session_memory import MemoryExtractionFailed

        store = MemoryStore()

        class TakenMeanwhile:
            async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> list[str]:
                lease = ctx.thread_lease()
                assert lease is not None
                await store.release_lease(lease)  # as if frozen past it: another worker
                await store.acquire_lease(lease.thread_id, "other", 60)  # took the thread
                return ["prefers tea"]

        memory = SessionMemory(
            TakenMeanwhile(), store=store, min_tokens=0, min_tool_calls=0, min_turns=1
        )
        agent = Agent(model=ScriptedModel(["noted"]), middleware=[memory])
        with capture_events() as events, pytest.raises(FencedOut):
            async with Session(agent, thread_id="fm", store=store) as session:
                result = await session.run("I prefer tea.")
                assert result.final_text == "noted"
                ctx = session.ctx
        counters = memory.counters(ctx)
        assert await store.notes("session_memory:thread:fm") == []
        failed = [e for e in events if isinstance(e, MemoryExtractionFailed)]
        assert len(failed) == 1 and "FencedOut" in failed[0].error
        assert counters.extractions == 0 and counters.marks.turns == 0
