"""The context view: materialized once per call, filtered by policy, on both carriers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    ConfigError,
    Layer,
    ModelRequest,
    RunConfig,
    RunContext,
    Session,
    Tool,
    ToolCall,
    ToolResult,
    UserMessage,
    before_model,
)
from tinyctx.chain import ToolCallHandler, compose
from tinyctx.frozen import FrozenDict
from tinyctx.middleware import (
    ContextPolicy,
    ContextView,
    Inherit,
    ViewSpec,
    run_subagent,
    subagent_tool,
)
from tinyctx.middleware.context_view import (
    VIEW_GLOBAL_KEY,
    VIEW_KEY,
    VIEW_STEP_KEY,
    ContextViewBuilt,
    view_mapping,
    with_step_values,
)
from tinyctx.testing import ScriptedModel, call, capture_events, reply, run_layer

REQUEST = ModelRequest(messages=(UserMessage("hi"),), system_prompt="You are helpful.")


def ctx_with(global_tier: dict[str, Any] | None = None, **configurable: Any) -> RunContext[Any]:
    values = dict(configurable)
    if global_tier is not None:
        values[VIEW_GLOBAL_KEY] = global_tier
    return RunContext.new(RunConfig(run_id="run-1", configurable=values))


class TestContextViewValue:
    """A frozen value: present fields by path, a generic header, JSON-ready dict."""

    def test_fields_render_and_dict(self) -> None:
        view = ContextView(
            project_root=Path("/repo"),
            work_dir="/repo/pkg",
            task_metadata={"ticket": "ABC-1", "points": 3},
            run_id="r1",
            aliases={"web": "frontend"},
            extra={"region": "eu", "flags": ["a", "b"]},
        )
        assert view.project_root == "/repo"
        assert view.fields() == {
            "project_root": "/repo",
            "work_dir": "/repo/pkg",
            "task_metadata.ticket": "ABC-1",
            "task_metadata.points": 3,
            "run_id": "r1",
            "aliases.web": "frontend",
            "extra.region": "eu",
            "extra.flags": ("a", "b"),
        }
        assert view.render() == "\n".join(
            [
                "<context>",
                "project_root: /repo",
                "work_dir: /repo/pkg",
                "task_metadata.ticket: ABC-1",
                "task_metadata.points: 3",
                "run_id: r1",
                "aliases.web: frontend",
                "extra.region: eu",
                'extra.flags: ["a", "b"]',
                "</context>",
            ]
        )
        assert json.loads(json.dumps(view.to_dict()))["extra"]["flags"] == ["a", "b"]
        assert not ContextView()
        assert ContextView(run_id="x")
        assert ContextView.of(RunContext.new()) is None
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            view.work_dir = "/elsewhere"  # type: ignore[misc]

    def test_bad_values_are_rejected(self) -> None:
        with pytest.raises(ConfigError, match="ContextView.project_root=3"):
            ContextView(project_root=3)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="needs a mapping"):
            ContextView(extra=["x"])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="non-empty strings"):
            ContextView(aliases={"": "x"})


class TestContextPolicy:
    """Pass-all by default; names are fields or field.key entries, checked at construction."""

    def test_default_passes_all(self) -> None:
        policy = ContextPolicy()
        assert policy.passes_all
        assert all(policy.allows(p) for p in ("run_id", "extra.x", "task_metadata.t"))

    def test_include_and_exclude(self) -> None:
        policy = ContextPolicy(include=["project_root", "extra"], exclude="extra.api_key")
        assert policy.include == ("project_root", "extra")
        assert policy.exclude == ("extra.api_key",)
        assert policy.allows("project_root")
        assert policy.allows("extra.region")
        assert not policy.allows("extra.api_key")
        assert not policy.allows("work_dir")
        assert not ContextPolicy(exclude=["task_metadata"]).allows("task_metadata.ticket")
        assert ContextPolicy(include=["aliases.web"]).allows("aliases.web")
        assert not ContextPolicy(include=["aliases.web"]).allows("aliases.api")

    @pytest.mark.parametrize(
        ("kwargs", "field", "bad"),
        [
            ({"include": ["project_rot"]}, "include", "project_rot"),
            ({"exclude": ["run_id.x"]}, "exclude", "run_id.x"),
            ({"exclude": ["extra."]}, "exclude", "extra."),
            ({"exclude": ["extra.a.b"]}, "exclude", "extra.a.b"),
            ({"exclude": [3]}, "exclude", 3),
        ],
    )
    def test_bad_names_fail_at_construction(
        self, kwargs: dict[str, Any], field: str, bad: Any
    ) -> None:
        with pytest.raises(ConfigError) as info:
            ContextPolicy(**kwargs)
        assert info.value.field == field
        assert info.value.value == bad
        assert "project_root" in str(info.value)  # the allowed names are listed

    def test_names_are_checked_against_a_subclass(self) -> None:
        assert ContextPolicy(exclude=["ticket"], view_type=TicketView).exclude == ("ticket",)
        with pytest.raises(ConfigError, match="ticket"):
            ContextPolicy(exclude=["ticket"])
        with pytest.raises(ConfigError, match="view_type"):
            ContextPolicy(view_type=dict)  # type: ignore[arg-type]


@attrs.frozen
class TicketView(ContextView):
    """A view with one more named field and one more mapping field."""

    ticket: str | None = None
    labels: FrozenDict[str, Any] = view_mapping()


class TestTiers:
    """Tiers merge step > agent > global > context, each only if the value is absent."""

    def test_precedence_and_only_if_absent_per_entry(self) -> None:
        ctx = ctx_with(
            {"project_root": "/global", "work_dir": "/g", "extra": {"a": "global", "b": "global"}},
            **{VIEW_STEP_KEY: {"work_dir": "/step-ctx", "c": "step-ctx"}},
        )
        spec = ViewSpec(agent={"project_root": "/agent", "extra": {"a": "agent"}, "d": "agent"})
        request = with_step_values(REQUEST, {"c": "step-request", "task_metadata": {"t": 1}})
        view, excluded = spec.build(ctx, request)
        assert excluded == 0
        assert view.project_root == "/agent"
        assert view.work_dir == "/step-ctx"
        assert view.run_id == "run-1"  # the context tier
        assert dict(view.extra) == {
            "c": "step-request",
            "a": "agent",
            "d": "agent",
            "b": "global",
        }
        assert dict(view.task_metadata) == {"t": 1}
        # a global run_id outranks the context's own run id
        assert spec.build(ctx_with({"run_id": "task-42"}))[0].run_id == "task-42"

    def test_an_inherited_view_replaces_the_global_tier(self) -> None:
        secret_spec = ViewSpec(policy=ContextPolicy(exclude=["extra.secret"]))
        parent = ctx_with({"secret": "s", "region": "eu", "project_root": "/p"})
        view, _ = secret_spec.build(parent)
        child = parent.derive(configurable=secret_spec.configurable_for(parent, view))
        # the child's configurable shadows the raw global tier and carries the view
        assert child.config.configurable[VIEW_GLOBAL_KEY] == {}
        assert ContextView.of(child) is view
        widened, _ = ViewSpec().build(child)  # a pass-all policy below cannot widen it
        assert "extra.secret" not in widened.fields()
        assert widened.fields() == view.fields()
        narrowed, excluded = ViewSpec(policy=ContextPolicy(exclude=["extra"])).build(child)
        assert narrowed.fields() == {"project_root": "/p", "run_id": "run-1"}
        assert excluded == 1

    def test_a_mapping_field_needs_a_mapping(self) -> None:
        with pytest.raises(TypeError, match="'aliases' takes a mapping"):
            ViewSpec().build(ctx_with({"aliases": "web"}))

    def test_spec_validation(self) -> None:
        with pytest.raises(ConfigError, match="ViewSpec.agent"):
            ViewSpec(agent=["x"])  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"ContextView.project_root=3"):
            ViewSpec(agent={"project_root": 3})
        with pytest.raises(ConfigError, match="header_tag"):
            ViewSpec(header_tag="bad tag")
        with pytest.raises(ConfigError, match="view_type"):
            ViewSpec(view_type=object)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="policy"):
            ViewSpec(policy=ContextPolicy(view_type=TicketView))
        with pytest.raises(ConfigError, match="policy"):
            ViewSpec(policy="all")  # type: ignore[arg-type]


SCALARS = ("project_root", "work_dir", "run_id")
MAPPINGS = ("task_metadata", "aliases", "extra")
LOOSE = ("region", "api_key", "owner")
ENTRY_KEYS = ("a", "b", "region")
values = st.text(max_size=4)


@st.composite
def tiers(draw: st.DrawFn) -> dict[str, Any]:
    tier: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(SCALARS + MAPPINGS + LOOSE), unique=True)):
        if key in MAPPINGS:
            tier[key] = draw(
                st.dictionaries(st.sampled_from(ENTRY_KEYS), values | st.integers(), max_size=3)
            )
        else:
            tier[key] = draw(values)
    return tier


ALL_NAMES = (
    *SCALARS,
    *MAPPINGS,
    *(f"{m}.{k}" for m in MAPPINGS for k in ENTRY_KEYS),
    *(f"extra.{k}" for k in LOOSE),
)
names = st.lists(st.sampled_from(ALL_NAMES), unique=True, max_size=6)


def _paths(tier: dict[str, Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in tier.items():
        if key in MAPPINGS:
            out.extend((f"{key}.{entry}", v) for entry, v in value.items())
        elif key in SCALARS:
            out.append((key, value))
        else:
            out.append((f"extra.{key}", value))
    return out


class TestPolicyProperty:
    """After any policy the view holds exactly the included-minus-excluded fields."""

    @given(
        step_request=tiers(),
        step_ctx=tiers(),
        agent=tiers(),
        global_tier=tiers(),
        include=st.none() | names,
        exclude=names,
    )
    def test_view_is_exactly_included_minus_excluded(
        self,
        step_request: dict[str, Any],
        step_ctx: dict[str, Any],
        agent: dict[str, Any],
        global_tier: dict[str, Any],
        include: list[str] | None,
        exclude: list[str],
    ) -> None:
        ctx = ctx_with(global_tier, **{VIEW_STEP_KEY: step_ctx})
        request = REQUEST.with_metadata({VIEW_STEP_KEY: step_request})
        spec = ViewSpec(policy=ContextPolicy(include=include, exclude=exclude), agent=agent)
        view, excluded = spec.build(ctx, request)
        merged: dict[str, Any] = {}
        for tier in (step_request, step_ctx, agent, global_tier, {"run_id": "run-1"}):
            for path, value in _paths(tier):
                merged.setdefault(path, value)

        def allowed(path: str) -> bool:
            head = path.split(".")[0]
            kept = include is None or path in include or head in include
            return kept and path not in exclude and head not in exclude

        assert view.fields() == {p: v for p, v in merged.items() if allowed(p)}
        assert excluded == sum(1 for p in merged if not allowed(p))
        # the header has one line per field, whatever the values hold (no line injection)
        lines = view.render().split("\n")
        assert (lines[0], lines[-1]) == ("<context>", "</context>")
        fields = view.fields()
        assert len(lines) == len(fields) + 2
        for line, (path, value) in zip(lines[1:-1], fields.items(), strict=True):
            head, _, text = line.partition(": ")
            assert head == path
            assert text == value or json.loads(text) == value


class ToolSees(Layer):
    """An outer tool layer that adds step values for the tool call."""

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        return await call_next(call, ctx.derive(configurable={VIEW_STEP_KEY: {"step": call.name}}))


class TestCarriers:
    """The same materialized view reaches the request and the context of tools and sub-agents."""

    async def test_one_model_call_carries_one_view_on_both_carriers(self) -> None:
        model = ScriptedModel([reply("ok")])
        ctx = ctx_with({"project_root": "/repo", "region": "eu"})
        with capture_events() as events:
            await run_layer(Inherit(), REQUEST, ctx, model)
        (request,) = model.requests
        (model_ctx,) = model.contexts
        view = request.metadata[VIEW_KEY]
        assert isinstance(view, ContextView)
        assert ContextView.of(model_ctx) is view  # one object, materialized once
        assert request.system_prompt == "You are helpful.\n\n" + view.render()
        assert view.fields() == {"project_root": "/repo", "run_id": "run-1", "extra.region": "eu"}
        built = [e for e in events if isinstance(e, ContextViewBuilt)]
        assert [(e.fields, e.excluded, e.run_id) for e in built] == [
            (("project_root", "run_id", "extra.region"), 0, model_ctx.run_id)
        ]

    async def test_header_can_be_turned_off_and_a_missing_prompt_is_created(self) -> None:
        model = ScriptedModel([reply("ok"), reply("ok")])
        ctx = ctx_with({"work_dir": "/w"})
        await run_layer(Inherit(view=ViewSpec(header=False)), REQUEST, ctx, model)
        assert model.requests[0].system_prompt == "You are helpful."
        assert model.requests[0].metadata[VIEW_KEY].work_dir == "/w"
        await run_layer(Inherit(), REQUEST.evolve(system_prompt=None), ctx, model)
        assert model.requests[1].system_prompt == model.requests[1].metadata[VIEW_KEY].render()

    async def test_tools_and_sub_agents_read_the_view_built_once_per_call(self) -> None:
        seen: dict[str, ContextView | None] = {}

        async def look(arguments: Any, ctx: RunContext[Any]) -> str:
            seen[str(arguments["who"])] = ContextView.of(ctx)
            return "looked"

        sub_model = ScriptedModel([reply("", call("look", who="sub")), "sub done"])
        sub = Agent(model=sub_model, tools=[Tool("look", handler=look)], name="helper")
        model = ScriptedModel(
            [reply("", call("look", who="parent"), call("helper", task="t")), "done"]
        )
        agent = Agent(
            model=model,
            tools=[Tool("look", handler=look), subagent_tool(sub)],
            middleware=[ToolSees(), Inherit(view=ViewSpec(agent={"work_dir": "/agent"}))],
            system_prompt="sys",
        )
        config = RunConfig(configurable={VIEW_GLOBAL_KEY: {"project_root": "/repo"}})
        async with Session(agent, config=config) as session:
            with capture_events() as events:
                result = await session.run("go")
        parent_view = seen["parent"]
        sub_view = seen["sub"]
        assert parent_view is not None and sub_view is not None
        assert parent_view.fields() == {
            "project_root": "/repo",
            "work_dir": "/agent",
            "run_id": result.run_id,
            "extra.step": "look",
        }
        # the sub-agent (no view layer of its own) sees its delegating call's view
        assert sub_view.fields() == {**parent_view.fields(), "extra.step": "helper"}
        model_view = model.requests[0].metadata[VIEW_KEY]
        assert {k: v for k, v in model_view.fields().items() if k != "extra.step"} == {
            k: v for k, v in parent_view.fields().items() if k != "extra.step"
        }
        # the raw step tier never reaches a request
        assert all(VIEW_STEP_KEY not in r.metadata for r in model.requests)
        # built once per call, and reused while its inputs are the same: the two model
        # calls share one build; each tool call has its own step values, so its own build
        built = [e for e in events if isinstance(e, ContextViewBuilt)]
        assert [e.fields[-1] for e in built] == ["run_id", "extra.step", "extra.step"]
        assert model.requests[1].metadata[VIEW_KEY] is model_view

    async def test_each_call_carries_its_own_prompt_and_metadata_with_a_reused_view(
        self,
    ) -> None:
        """The view is reused across calls, but a call that brings another system prompt
        or other metadata gets the header on its own prompt and the view in its own
        metadata; one that brings the same ones gets the same carriers again."""
        model = ScriptedModel(["a", "b", "c", "d", "e", "f"])
        ctx = ctx_with({"region": "eu"})
        layer = Inherit()
        prompt_only = REQUEST.evolve(system_prompt="Be brief.")
        metadata_only = REQUEST.evolve(metadata={"trace": "t-2"})
        assert prompt_only.metadata is REQUEST.metadata
        assert metadata_only.system_prompt is REQUEST.system_prompt
        # each change comes right after a call with the same other carrier
        sequence = (REQUEST, REQUEST, prompt_only, REQUEST, metadata_only)
        for request in (*sequence, REQUEST.evolve(system_prompt=None)):
            await run_layer(layer, request, ctx, model)
        first, again, brief, back, traced, bare = model.requests
        header = first.metadata[VIEW_KEY].render()
        assert first.system_prompt == again.system_prompt == "You are helpful.\n\n" + header
        assert again.metadata is first.metadata  # the same carriers, reused
        assert brief.system_prompt == "Be brief.\n\n" + header
        assert back.system_prompt == first.system_prompt
        assert traced.system_prompt == first.system_prompt
        assert traced.metadata["trace"] == "t-2" and "trace" not in first.metadata
        assert traced.metadata[VIEW_KEY].fields()["extra.region"] == "eu"
        assert bare.system_prompt == header
        assert {r.metadata[VIEW_KEY] for r in model.requests} == {first.metadata[VIEW_KEY]}

    async def test_a_reused_view_is_rebuilt_when_its_inputs_change(self) -> None:
        model = ScriptedModel(["a", "b", "c"])
        agent = Agent(model=model, middleware=[Inherit()])
        config = RunConfig(configurable={VIEW_GLOBAL_KEY: {"region": "eu"}})
        async with Session(agent, config=config) as session:
            first = await session.run("1")
            second = await session.run("2")
        views = [r.metadata[VIEW_KEY] for r in model.requests[:2]]
        assert [v.run_id for v in views] == [first.run_id, second.run_id]
        other = RunConfig(configurable={VIEW_GLOBAL_KEY: {"region": "us"}})
        async with Session(agent, config=other) as session:
            await session.run("3")
        assert model.requests[2].metadata[VIEW_KEY].extra == {"region": "us"}

    async def test_a_new_extra_entry_and_a_new_named_field_reach_every_carrier(self) -> None:
        seen: list[ContextView | None] = []

        async def look(arguments: Any, ctx: RunContext[Any]) -> str:
            seen.append(ContextView.of(ctx))
            return "ok"

        spec = ViewSpec(
            agent={"ticket": "T-7", "labels": {"team": "core"}, "brand_new": "yes"},
            view_type=TicketView,
        )
        model = ScriptedModel([reply("", call("look")), "done"])
        agent = Agent(
            model=model, tools=[Tool("look", handler=look)], middleware=[Inherit(view=spec)]
        )
        await agent.run("go")
        request_view = model.requests[0].metadata[VIEW_KEY]
        assert isinstance(request_view, TicketView)
        for carried in (request_view, seen[0]):
            assert isinstance(carried, TicketView)
            assert carried.ticket == "T-7"
            assert carried.labels == {"team": "core"}
            assert carried.extra == {"brand_new": "yes"}
        header = model.requests[0].system_prompt or ""
        assert "ticket: T-7" in header
        assert "labels.team: core" in header
        assert "extra.brand_new: yes" in header

    async def test_run_subagent_outside_a_layer_still_hands_the_view_down(self) -> None:
        spec = ViewSpec(policy=ContextPolicy(exclude=["extra.token"]))
        parent = ctx_with({"token": "t0k", "region": "eu"})
        view, _ = spec.build(parent)
        ctx = parent.derive(configurable=spec.configurable_for(parent, view))
        sub_model = ScriptedModel(["ok"])
        await run_subagent(Agent(model=sub_model, middleware=[Inherit()]), "go", ctx)
        carried = sub_model.requests[0].metadata[VIEW_KEY]
        assert carried.fields() == {"run_id": "run-1", "extra.region": "eu"}


SECRET = "sk-live-5f1a9c"


@before_model
async def step_secret(request: ModelRequest, ctx: RunContext[Any]) -> ModelRequest:
    return with_step_values(request, {"step_token": SECRET, "step_note": "visible-step"})


class StepSecretForTools(Layer):
    """Puts a secret in the tool calls' step tier."""

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        values = {VIEW_STEP_KEY: {"step_token": SECRET}}
        return await call_next(call, ctx.derive(configurable=values))


class TestSecretNeverLeaks:
    """An excluded secret appears in no request, schema, header, event or log line."""

    @pytest.mark.usefixtures("all_log_levels")
    async def test_excluded_secret_is_nowhere(self) -> None:
        async def show_view(arguments: Any, ctx: RunContext[Any]) -> str:
            view = ContextView.of(ctx)
            return json.dumps(view.to_dict() if view else None)

        policy = ContextPolicy(
            exclude=["extra.api_key", "task_metadata.password", "extra.step_token"]
        )
        sub_model = ScriptedModel([reply("", call("show_view")), "sub done"])
        sub = Agent(
            model=sub_model,
            tools=[Tool("show_view", handler=show_view)],
            middleware=[Inherit()],  # pass-all below: still cannot see what was excluded
            name="helper",
        )
        model = ScriptedModel(
            [reply("", call("show_view"), call("helper", task="go on")), "finished"]
        )
        agent = Agent(
            model=model,
            tools=[Tool("show_view", handler=show_view), subagent_tool(sub)],
            middleware=[step_secret, StepSecretForTools(), Inherit(view=policy)],
            system_prompt="sys",
        )
        config = RunConfig(
            configurable={
                VIEW_GLOBAL_KEY: {
                    "project_root": "/repo",
                    "api_key": SECRET,
                    "task_metadata": {"password": SECRET, "ticket": "T-1"},
                }
            }
        )
        with structlog.testing.capture_logs() as logs, capture_events() as events:
            async with Session(agent, config=config) as session:
                result = await session.run("go")
        assert result.final_text == "finished"
        requests = [*model.requests, *sub_model.requests]
        schemas = [spec for request in requests for spec in request.tools]
        surfaces = {
            "requests": repr(requests),
            "schemas": repr(schemas),
            "headers": repr([r.system_prompt for r in requests]),
            "metadata": repr([dict(r.metadata) for r in requests]),
            "events": repr(events),
            "logs": repr(logs),
            "messages": repr(session.conversation_messages),
        }
        for where, text in surfaces.items():
            assert SECRET not in text, where
            for name in ("api_key", "password", "step_token"):
                assert name not in text, (where, name)
        # the positive control: the same surfaces do carry what the policy lets through
        assert "T-1" in surfaces["headers"] and "/repo" in surfaces["headers"]
        assert "visible-step" in surfaces["headers"]
        assert '"ticket": "T-1"' in surfaces["messages"]
        assert any(log["event"] == "context.view" for log in logs)  # debug lines captured
        assert len(logs) >= len([e for e in events if e.level != "trace"])


class TestComposition:
    """Two Inherit layers nest; the inner one builds from the outer's view."""

    async def test_nested_layers_narrow_never_widen(self) -> None:
        model = ScriptedModel([reply("ok")])
        outer = Inherit(view=ContextPolicy(exclude=["extra.k"]), name="outer")
        inner = Inherit(tags=("inner",), view=ViewSpec(agent={"k": "inner"}), name="inner")
        onion = compose([outer, inner], model)
        await onion(REQUEST, ctx_with({"k": "global", "region": "eu"}))
        request = model.requests[0]
        view = request.metadata[VIEW_KEY]
        # the inner layer's own agent tier may add k: the outer policy filtered the outer view
        assert view.fields() == {"run_id": "run-1", "extra.region": "eu", "extra.k": "inner"}
        # one header: the inner layer's replaces the outer's
        assert request.system_prompt == "You are helpful.\n\n" + view.render()
