"""Assertions for the invariants every layer must keep. They raise AssertionError with a
message that says what broke, so they read well in pytest and shrink well in hypothesis."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import attrs

from ..context import RunContext
from ..errors import PairingError
from ..events import Event
from ..messages import Message, ToolResult, check_pairing, pending_tool_calls

__all__ = [
    "assert_pairing_intact",
    "assert_parent_unchanged",
    "assert_idempotent",
    "assert_events_form_tree",
    "context_snapshot",
]

T = TypeVar("T")


def assert_pairing_intact(
    after: Sequence[Message],
    before: Sequence[Message] | None = None,
    *,
    allow_pending: bool = True,
) -> None:
    """``after`` has no orphan; with ``before``, every call answered there is answered here.

    A layer may drop a whole call/result unit (trim, summarize) but never half of one.
    """
    try:
        check_pairing(after, allow_pending=allow_pending)
    except PairingError as exc:
        raise AssertionError(f"pairing broken: {exc}") from None
    if before is not None:
        pending_before = {c.id for c in pending_tool_calls(before)}
        pending_after = {c.id for c in pending_tool_calls(after)}
        if pending_after - pending_before:
            raise AssertionError(
                f"calls answered before are pending after: {sorted(pending_after - pending_before)}"
            )
        answered_after = {m.tool_call_id for m in after if isinstance(m, ToolResult)}
        called_after = {c.id for m in after for c in getattr(m, "tool_calls", ())}
        if not answered_after <= called_after:
            raise AssertionError(f"results without calls: {sorted(answered_after - called_after)}")


def context_snapshot(ctx: RunContext[Any]) -> dict[str, Any]:
    """Everything of ``ctx`` a nested call must not change, as comparable values."""
    return {
        "config": ctx.config,
        "data": ctx.data,
        "cancelled": ctx.cancellation.is_cancelled(),
        "control": ctx.control.peek(),
        "fields": {a.name: id(getattr(ctx, a.name)) for a in attrs.fields(type(ctx))},
    }


async def assert_parent_unchanged(
    ctx: RunContext[Any], fn: Callable[[RunContext[Any]], Awaitable[Any] | Any]
) -> Any:
    """Call ``fn(ctx)`` (sync or async), assert ``ctx`` is exactly as before, return the value."""
    before = context_snapshot(ctx)
    result = fn(ctx)
    if inspect.isawaitable(result):
        result = await result
    after = context_snapshot(ctx)
    for key in before:
        if before[key] != after[key]:
            raise AssertionError(
                f"parent context changed ({key}): {before[key]!r} -> {after[key]!r}"
            )
    return result


def assert_idempotent(fn: Callable[[T], T], value: T) -> T:
    """``fn(fn(value)) == fn(value)``; returns ``fn(value)``."""
    once = fn(value)
    twice = fn(once)
    if twice != once:
        raise AssertionError(
            f"not idempotent: applying twice changed the result\nonce:  {once!r}\ntwice: {twice!r}"
        )
    return once


def assert_events_form_tree(events: Sequence[Event]) -> None:
    """The events' run ids form one tree: one root, every parent exists, no run has two parents."""
    if not events:
        return
    roots = {e.root_run_id for e in events}
    if len(roots) != 1:
        raise AssertionError(f"events belong to {len(roots)} roots: {sorted(roots)}")
    (root,) = roots
    parent_of: dict[str, str | None] = {root: None}
    for event in events:
        chain = (*event.lineage, event.run_id) if event.lineage else None
        if event.run_id == root:
            if event.parent_run_id is not None:
                raise AssertionError(f"root run {root} has a parent {event.parent_run_id}")
            continue
        if event.parent_run_id is None:
            raise AssertionError(
                f"run {event.run_id} ({event.kind}) has no parent but is not the root"
            )
        if chain is None:
            raise AssertionError(
                f"run {event.run_id} ({event.kind}) carries no lineage to the root"
            )
        if chain[0] != root:
            raise AssertionError(
                f"lineage of {event.run_id} starts at {chain[0]}, not the root {root}"
            )
        if chain[-2] != event.parent_run_id:
            raise AssertionError(
                f"run {event.run_id}: parent_run_id {event.parent_run_id} "
                f"disagrees with lineage {chain}"
            )
        for parent, child in itertools.pairwise(chain):
            known = parent_of.get(child, parent)
            if known != parent:
                raise AssertionError(f"run {child} has two parents: {known} and {parent}")
            parent_of[child] = parent
    # every parent exists as a node, and walking up always reaches the root (no cycle)
    for node in parent_of:
        seen = set()
        current: str | None = node
        while current is not None:
            if current in seen:
                raise AssertionError(f"cycle in run tree at {current}")
            seen.add(current)
            if current not in parent_of:
                raise AssertionError(f"parent run {current} does not exist in the tree")
            current = parent_of[current]
        if root not in seen:
            raise AssertionError(f"run {node} does not reach the root")
