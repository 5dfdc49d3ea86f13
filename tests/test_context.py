"""RunConfig, RunContext and derive(): identity, inheritance and immutability."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import ConfigError, DepthLimitExceeded, MemoryStore, RunConfig, RunContext, Usage
from tinyctx.frozen import FrozenDict
from tinyctx.testing import assert_parent_unchanged
from tinyctx.testing.invariants import context_snapshot
from tinyctx.testing.strategies import contexts, json_values
from tinyctx.usage import Price

derive_overrides = st.fixed_dictionaries(
    {},
    optional={
        "thread_id": st.text("abc123", min_size=1, max_size=6),
        "tags": st.lists(st.text("xyz", min_size=1, max_size=3), max_size=3),
        "metadata": st.dictionaries(st.text("kv", min_size=1, max_size=3), json_values, max_size=3),
        "configurable": st.dictionaries(
            st.text("kv", min_size=1, max_size=3), json_values, max_size=2
        ),
        "data": st.integers(),
    },
)


class TestRunConfig:
    """A fresh RunConfig is a root run; bad values fail at construction, naming the field."""

    def test_new_config_is_its_own_root(self) -> None:
        config = RunConfig()
        assert config.root_run_id == config.run_id
        assert config.parent_run_id is None
        assert config.depth == 0
        assert config.lineage == ()
        assert RunConfig().run_id != config.run_id

    @pytest.mark.parametrize(
        ("field", "value", "allowed"),
        [
            ("max_model_calls", 0, ">= 1"),
            ("max_depth", -1, ">= 0"),
            ("depth", -2, ">= 0"),
            ("max_tokens", 0, ">= 1"),
            ("reserved_output_tokens", -1, ">= 0"),
            ("run_id", "", "non-empty"),
            ("tags", ["ok", ""], "non-empty strings"),
        ],
    )
    def test_invalid_values_name_the_field(self, field: str, value: Any, allowed: str) -> None:
        with pytest.raises(ConfigError) as info:
            RunConfig(**{field: value})
        assert info.value.field == field
        assert field in str(info.value)
        assert allowed in str(info.value)

    def test_reserved_must_be_below_window(self) -> None:
        with pytest.raises(
            ConfigError, match=r"reserved_output_tokens=8000.*< max_tokens \(8000\)"
        ):
            RunConfig(max_tokens=8000, reserved_output_tokens=8000)

    def test_validators_rerun_on_evolve(self) -> None:
        config = RunConfig(max_tokens=1000)
        with pytest.raises(ConfigError):
            config.evolve(reserved_output_tokens=5000)

    def test_metadata_is_read_only_and_detached(self) -> None:
        source = {"k": ["a"]}
        config = RunConfig(metadata=source)
        source["k"].append("b")
        assert config.metadata == {"k": ("a",)}
        with pytest.raises(TypeError):
            config.metadata["k"] = 1  # type: ignore[index]
        assert config.usable_tokens is None
        assert RunConfig(max_tokens=100, reserved_output_tokens=10).usable_tokens == 90


class TestDerive:
    """derive() makes a child with the inheritance rules and never changes the parent."""

    @given(ctx=contexts(), overrides=derive_overrides)
    def test_derive_never_mutates_parent(
        self, ctx: RunContext[Any], overrides: dict[str, Any]
    ) -> None:
        before = attrs.asdict(ctx.config, recurse=True)
        snapshot = context_snapshot(ctx)
        child = ctx.derive(**overrides)
        assert attrs.asdict(ctx.config, recurse=True) == before
        assert context_snapshot(ctx) == snapshot
        assert child is not ctx

    @given(ctx=contexts(), overrides=derive_overrides)
    def test_child_follows_inheritance_rules(
        self, ctx: RunContext[Any], overrides: dict[str, Any]
    ) -> None:
        child = ctx.derive(**overrides)
        parent = ctx.config
        assert child.run_id != parent.run_id
        assert child.parent_run_id == parent.run_id
        assert child.root_run_id == parent.root_run_id
        assert child.thread_id == overrides.get("thread_id", parent.thread_id)
        assert child.depth == parent.depth + 1
        assert child.config.lineage == (*parent.lineage, parent.run_id)
        # tags: parent's first, child's added, nothing removed
        assert child.tags[: len(parent.tags)] == parent.tags
        assert set(child.tags) == set(parent.tags) | set(overrides.get("tags", ()))
        # metadata: parent's keys kept, child's added (a child's value wins in the child)
        expected = {**parent.metadata, **overrides.get("metadata", {})}
        assert set(child.metadata) == set(expected)
        # shared handles: one per tree
        for handle in (
            "events",
            "stores",
            "usage",
            "costs",
            "cache",
            "control",
            "conversation",
            "tools",
        ):
            assert getattr(child, handle) is getattr(ctx, handle), handle
        assert child.cancellation is not ctx.cancellation
        assert child.data == overrides.get("data", ctx.data)
        # limits and window are inherited
        for limit in (
            "max_depth",
            "max_model_calls",
            "max_tool_calls",
            "max_tokens",
            "model",
            "user_id",
        ):
            assert getattr(child.config, limit) == getattr(parent, limit)

    @given(depth=st.integers(1, 12))
    def test_ids_hold_at_any_depth(self, depth: int) -> None:
        root = RunContext.new(RunConfig(max_depth=depth))
        chain = [root]
        for _ in range(depth):
            chain.append(chain[-1].derive(tags=(f"d{len(chain)}",)))
        leaf = chain[-1]
        assert leaf.depth == depth
        assert leaf.root_run_id == root.run_id
        assert leaf.config.lineage == tuple(c.run_id for c in chain[:-1])
        assert len({c.run_id for c in chain}) == depth + 1
        with pytest.raises(DepthLimitExceeded, match=f"exceeds max_depth={depth}"):
            leaf.derive()

    async def test_assert_parent_unchanged_helper_catches_mutation(self) -> None:
        ctx = RunContext.new()
        await assert_parent_unchanged(ctx, lambda c: c.derive(tags=("x",)))
        with pytest.raises(AssertionError, match="control"):
            from tinyctx import StopWithFinal

            await assert_parent_unchanged(ctx, lambda c: c.request_control(StopWithFinal("x")))

    def test_cancel_flows_down_not_up(self) -> None:
        parent = RunContext.new()
        child = parent.derive()
        grandchild = child.derive()
        child.cancellation.cancel("child only")
        assert not parent.cancellation.is_cancelled()
        assert grandchild.cancellation.is_cancelled()
        sibling = parent.derive()
        parent.cancellation.cancel("all")
        assert sibling.cancellation.is_cancelled()


class TestDeriveConfigurable:
    """A derived context's configurable is its parent's merged with the call's, on every call."""

    @given(
        steps=st.lists(
            st.tuples(
                st.integers(0, 2),
                st.integers(0, 2),
                st.booleans(),
                st.dictionaries(st.sampled_from("ab"), st.integers(), max_size=2),
            ),
            min_size=1,
            max_size=12,
        )
    )
    def test_repeated_and_changing_mappings_always_merge_right(
        self, steps: list[tuple[int, int, bool, dict[str, int]]]
    ) -> None:
        """The same frozen objects again (a layer's constant values) and mutable dicts
        changed between calls both give exactly parent | added, never a previous merge."""
        parents: list[RunContext[Any]] = [
            RunContext.new(RunConfig(configurable={"a": i, f"p{i}": i})) for i in range(3)
        ]
        frozen_added: list[FrozenDict[str, int]] = [FrozenDict({"b": i, "a": -i}) for i in range(3)]
        mutable: dict[str, int] = {}
        for parent_index, added_index, use_mutable, update in steps:
            parent = parents[parent_index]
            if use_mutable:
                mutable.clear()
                mutable.update(update or {"a": 99})
                added: Mapping[str, Any] = mutable
            else:
                added = frozen_added[added_index]
            child = parent.derive(configurable=added)
            assert dict(child.config.configurable) == {**parent.config.configurable, **added}


class TestSharedHandles:
    """Usage, costs, cache and stores are one per tree."""

    def test_usage_rolls_up_from_nested_calls(self) -> None:
        ctx = RunContext.new()
        ctx.derive().derive().usage.add("gpt-4o", Usage(100, 10))
        ctx.derive().usage.add("claude-sonnet-4-5", Usage(50, 5, 20))
        ctx.usage.add("gpt-4o", Usage(1, 1))
        assert ctx.usage.total() == Usage(151, 16, 20)
        assert ctx.usage.by_model()["gpt-4o"] == Usage(101, 11)
        assert ctx.usage.calls == 3

    def test_costs_use_the_price_table_and_report_unpriced(self) -> None:
        ctx = RunContext.new(prices={"gpt-4o": Price(2.5, 10.0, cached_input=1.25)})
        ctx.usage.add("gpt-4o-2024-08-06", Usage(1_000_000, 100_000, 400_000))
        ctx.usage.add("mystery-model", Usage(10, 10))
        assert ctx.costs.total() == pytest.approx(0.6 * 2.5 + 0.4 * 1.25 + 0.1 * 10.0)
        assert ctx.costs.unpriced() == ("mystery-model",)
        with pytest.raises(ConfigError, match="prices"):
            RunContext.new(prices={"x": 3.0})  # type: ignore[dict-item]
        with pytest.raises(ConfigError, match="input"):
            Price(-1, 0)

    def test_cache_namespaces_and_layer_state(self) -> None:
        ctx = RunContext.new()
        child = ctx.derive()
        child.cache.namespace("a")["k"] = 1
        assert ctx.cache.namespace("a") == {"k": 1}
        owner = object()
        state = child.state_for(owner, list)
        state.append(1)
        assert ctx.state_for(owner, list) == [1]
        assert RunContext.new().state_for(owner, list) == []

    def test_stores_are_named_and_validated(self) -> None:
        store = MemoryStore()
        ctx = RunContext.new(stores={"notes": store})
        assert ctx.derive().stores["notes"] is store
        with pytest.raises(KeyError, match="no store named 'missing'.*notes"):
            ctx.stores["missing"]
        with pytest.raises(TypeError, match="Store protocol"):
            RunContext.new(stores={"bad": object()})  # type: ignore[dict-item]
