"""Declared ordering between layers: Agent validates, errors name both layers, nothing moves."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    AssistantMessage,
    ConfigError,
    Layer,
    ModelRequest,
    ModelResponse,
    RunContext,
)
from tinyctx.chain import has_hook, layer_name
from tinyctx.cli import StackError, load_stack
from tinyctx.middleware import (
    BudgetGuard,
    CallLimits,
    ControlOutcomes,
    Fallback,
    Inherit,
    Microcompact,
    Retry,
    SessionMemory,
    ToolResultBudget,
)
from tinyctx.ordering import (
    Innermost,
    Inside,
    Once,
    OrderingError,
    Outermost,
    Outside,
    check_constraints_consistent,
    constraints_of,
    find_violations,
    satisfying_order,
)


async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    return ModelResponse(AssistantMessage("ok"))


class Plain(Layer):
    async def wrap_model(self, request: Any, ctx: Any, call_next: Any) -> Any:
        return await call_next(request, ctx)


class Tracer(Plain):
    constraints = (Outermost("model", reason="it times the whole onion"),)


class Core(Plain):
    constraints = (Innermost("model"),)


class Cache(Plain):
    constraints = (Outside("Plain", reason="it must see the request Plain rewrites"),)


class NeedsCache(Plain):
    constraints = (Inside(Cache, required=True),)


class Single(Plain):
    constraints = (Once(),)


def named(layer: Layer, name: str) -> Layer:
    layer.name = name
    return layer


class TestDeclaredRules:
    """Each kind of rule accepts the stacks that keep it and refuses the others."""

    def test_outside_by_name_refused_with_both_layers_indices_and_a_fix(self) -> None:
        """A violation names both layers, their indices, the rule, its reason and a fix."""
        with pytest.raises(OrderingError) as info:
            Agent(model, middleware=[Plain(), Cache()])
        text = str(info.value)
        assert "'Cache' (middleware[1]) must be outside Plain" in text
        assert "'Plain' is at middleware[0]" in text
        assert "it must see the request Plain rewrites" in text
        assert "[Cache, Plain]" in text
        assert isinstance(info.value, ConfigError)

    def test_outside_accepted_and_order_kept(self) -> None:
        """A stack that keeps the rule is built as given: nothing is reordered."""
        layers = [Cache(), Plain()]
        agent = Agent(model, middleware=layers)
        assert list(agent.middleware) == layers

    def test_inside_by_class_and_required(self) -> None:
        """Inside(Cache, required=True) needs a Cache present and outside it."""
        with pytest.raises(OrderingError, match="add a Cache layer"):
            Agent(model, middleware=[NeedsCache()])
        with pytest.raises(OrderingError, match="must be inside Cache"):
            Agent(model, middleware=[NeedsCache(), Cache()])
        Agent(model, middleware=[Cache(), NeedsCache()])

    def test_outermost_and_innermost_of_a_hook(self) -> None:
        """Outermost/Innermost only count layers that implement the hook."""

        class ToolOnly(Layer):
            async def wrap_tool(self, call: Any, ctx: Any, call_next: Any) -> Any:
                return await call_next(call, ctx)

        Agent(model, middleware=[ToolOnly(), Tracer(), Plain(), Core()])
        with pytest.raises(OrderingError, match="outermost model layer"):
            Agent(model, middleware=[Plain(), Tracer()])
        with pytest.raises(OrderingError, match="innermost model layer"):
            Agent(model, middleware=[Core(), Plain()])

    def test_once_refuses_a_second_instance(self) -> None:
        """Once counts instances of the class, whatever their names."""
        with pytest.raises(OrderingError, match="may appear only once"):
            Agent(model, middleware=[Single(), named(Single(), "other")])

    def test_neutral_observers_are_ignored(self) -> None:
        """An ordering_neutral observer may sit outside an Outermost layer."""

        class Probe(Plain):
            ordering_neutral = True

        Agent(model, middleware=[Probe(), Tracer()])

    def test_bad_rules_are_config_errors(self) -> None:
        """A rule with a bad target or hook fails at construction, naming the field."""
        with pytest.raises(ConfigError, match="target"):
            Outside(42)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="hook"):
            Outermost("stream")  # type: ignore[arg-type]

        class Broken(Plain):
            constraints = ("outside retry",)  # type: ignore[assignment]

        with pytest.raises(ConfigError, match="constraints"):
            Agent(model, middleware=[Broken()])

    def test_contradictory_rules_are_reported(self) -> None:
        """Rules that no order satisfies say so instead of suggesting an order."""

        class A(Plain):
            constraints = (Outside("B"),)

        class B(Plain):
            constraints = (Outside("A"),)

        with pytest.raises(OrderingError, match="rules contradict"):
            Agent(model, middleware=[A(), B()])
        assert check_constraints_consistent(A()) == []

    def test_consistency_of_one_layers_rules(self) -> None:
        """A layer cannot be both outside and inside one target, or outermost and innermost."""

        class Confused(Plain):
            constraints = (Outside("X"), Inside("X"), Outermost("model"), Innermost("model"))

        class WrongHook(Plain):
            constraints = (Outermost("tool"),)

        problems = check_constraints_consistent(Confused())
        assert any("both outside and inside 'X'" in p for p in problems)
        assert any("outermost and innermost model" in p for p in problems)
        assert "does not implement the tool hook" in check_constraints_consistent(WrongHook())[0]


class TestBuiltinRules:
    """The built-in layers declare the rules that are true of them."""

    def test_fallback_must_be_outside_retry(self) -> None:
        """Retry outside Fallback is refused; Fallback outside Retry is the working order."""
        refused = "'Fallback' \\(middleware\\[1\\]\\) must be outside Retry"
        with pytest.raises(OrderingError, match=refused):
            Agent(model, middleware=[Retry(), Fallback(model)])
        Agent(model, middleware=[Fallback(model), Retry()])

    def test_guard_outside_fallback_and_only_once(self) -> None:
        """A guard inside Fallback would leave the alternatives' requests unbudgeted."""
        with pytest.raises(OrderingError, match="must be outside Fallback"):
            Agent(model, middleware=[Fallback(model), BudgetGuard()])
        with pytest.raises(OrderingError, match="only once"):
            Agent(model, middleware=[BudgetGuard(), named(BudgetGuard(), "g2")])

    def test_control_outcomes_and_session_memory_only_once(self) -> None:
        """Two of either would drain one slot, or extract one conversation, twice."""
        for make in (ControlOutcomes, SessionMemory):
            with pytest.raises(OrderingError, match="only once"):
                Agent(model, middleware=[make(), named(make(), "again")])

    def test_every_builtin_layer_is_consistent(self) -> None:
        """No built-in layer declares rules that contradict each other."""
        for layer in builtin_layers():
            assert check_constraints_consistent(layer) == [], layer


class TestStacksAreValidated:
    """Named stacks and TOML stack files are validated like an Agent, before replaying."""

    def test_named_stacks_pass(self) -> None:
        """The shipped named stacks keep every rule."""
        for name in ("default", "seed-order"):
            assert find_violations(load_stack(name)) == []

    def test_toml_stack_violation_names_the_file(self, tmp_path: Path) -> None:
        """A TOML stack breaking a rule is a StackError naming the file and both layers."""
        path = tmp_path / "stack.toml"
        path.write_text(
            '[[layers]]\nuse = "budget_guard"\n[[layers]]\nuse = "budget_guard"\nname = "g2"\n',
            encoding="utf-8",
        )
        with pytest.raises(StackError) as info:
            load_stack(str(path))
        assert str(path) in str(info.value)
        assert "'BudgetGuard' (middleware[0]) may appear only once" in str(info.value)
        assert "'g2' is at middleware[1]" in str(info.value)


def builtin_layers() -> list[Layer]:
    return [
        Inherit(),
        ControlOutcomes(),
        CallLimits(model_calls=100),
        Fallback(model),
        Retry(),
        BudgetGuard(),
        ToolResultBudget(),
        Microcompact(),
        SessionMemory(),
    ]


def _breaks(layers: list[Any]) -> set[tuple[str, str]]:
    """An independent reading of every declared rule: (layer, rule) pairs the stack breaks."""
    broken: set[tuple[str, str]] = set()
    for i, layer in enumerate(layers):
        for rule in constraints_of(layer):
            key = (layer_name(layer), rule.describe())
            if isinstance(rule, Once):
                if sum(type(o) is type(layer) for o in layers) > 1:
                    broken.add(key)
                continue
            for j, other in enumerate(layers):
                if j == i:
                    continue
                if isinstance(rule, Outside | Inside):
                    target = rule.target
                    hit = (
                        layer_name(other) == target
                        if isinstance(target, str)
                        else isinstance(other, target)
                    )
                    if hit and ((j < i) if isinstance(rule, Outside) else (j > i)):
                        broken.add(key)
                elif has_hook(other, rule.hook) and (
                    (j < i) if isinstance(rule, Outermost) else (j > i)
                ):
                    broken.add(key)
    return broken


class TestOrderingProperty:
    """Random permutations of the built-in stack are accepted exactly when they keep every rule."""

    @given(
        order=st.permutations(range(9)),
        extra=st.sampled_from([None, "guard", "control", "memory"]),
    )
    def test_permutation_accepted_iff_every_rule_holds(
        self, order: list[int], extra: str | None
    ) -> None:
        """Accepted stacks break no rule; refused ones name a rule they really break."""
        base = builtin_layers()
        layers: list[Any] = [base[i] for i in order]
        if extra is not None:
            twin = {"guard": BudgetGuard, "control": ControlOutcomes, "memory": SessionMemory}
            layers.append(named(twin[extra](), f"second_{extra}"))
        independent = _breaks(layers)
        error: OrderingError | None = None
        try:
            agent = Agent(model, middleware=layers)
        except OrderingError as exc:
            error = exc
        if error is not None:
            exc = error
            v = exc.violation
            assert (v.layer, v.rule.describe()) in independent
            assert f"middleware[{v.index}]" in str(exc)
            if v.other is not None:
                assert repr(v.other) in str(exc)
                assert f"middleware[{v.other_index}]" in str(exc)
            if exc.suggestion is not None:
                by_name = {layer_name(layer): layer for layer in layers}
                fixed = [by_name[n] for n in exc.suggestion]
                assert _breaks(fixed) == set()
                Agent(model, middleware=fixed)
        else:
            assert independent == set()
            assert list(agent.middleware) == layers

    def test_suggestion_is_stable(self) -> None:
        """The suggested order moves only what must move."""
        layers: list[Any] = [Retry(), Inherit(), Fallback(model), Microcompact()]
        assert satisfying_order(layers) == ["Inherit", "Fallback", "Retry", "Microcompact"]
        for perm in itertools.permutations(builtin_layers()[:4]):
            assert satisfying_order(list(perm)) is not None
