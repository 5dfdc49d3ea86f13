"""Assertions for the invariants every layer must keep. They raise AssertionError with a
message that says what broke, so they read well in pytest and shrink well in hypothesis."""

from __future__ import annotations

import copy
import inspect
import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, overload

import attrs

from ..context import RunContext
from ..errors import PairingError
from ..events import Event
from ..messages import AssistantMessage, Message, ToolResult, check_pairing, pending_tool_calls
from ..model import ModelRequest
from ..tokens import TokenCounter

__all__ = [
    "assert_pairing_intact",
    "assert_parent_unchanged",
    "assert_within_budget",
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
    Pass ``allow_pending=False`` for what is sent to a model (no call may wait there).
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
        called_after = {
            c.id for m in after if isinstance(m, AssistantMessage) for c in m.tool_calls
        }
        if not answered_after <= called_after:
            raise AssertionError(f"results without calls: {sorted(answered_after - called_after)}")


def _copy_of_data(data: Any) -> Any:
    # a deep copy detects in-place edits of mutable app data; an uncopyable value is
    # compared by identity (and by its own __eq__)
    try:
        return copy.deepcopy(data)
    except Exception:
        return data


def context_snapshot(ctx: RunContext[Any]) -> dict[str, Any]:
    """Everything of ``ctx`` a nested call must not change, as comparable values."""
    return {
        "config": ctx.config,
        "data": _copy_of_data(ctx.data),
        "cancelled": ctx.cancellation.is_cancelled(),
        "control": ctx.control.peek(),
        "fields": {a.name: id(getattr(ctx, a.name)) for a in attrs.fields(type(ctx))},
    }


def _compare_snapshots(before: dict[str, Any], after: dict[str, Any]) -> None:
    for key in before:
        try:
            same = bool(before[key] == after[key])
        except Exception:  # data whose __eq__ raises: identity is all we can compare
            same = before[key] is after[key]
        if not same:
            raise AssertionError(
                f"parent context changed ({key}): {before[key]!r} -> {after[key]!r}"
            )


async def assert_parent_unchanged(
    ctx: RunContext[Any], fn: Callable[[RunContext[Any]], Awaitable[Any] | Any]
) -> Any:
    """Call ``fn(ctx)`` (sync or async), assert ``ctx`` is exactly as before, return the value.

    Compared: the config (ids, tags, metadata, limits), the app data (by value when it can
    be deep-copied), the cancellation state, the pending control request, and the identity
    of every handle. Shared trackers (usage, conversation) may change: they are shared.
    """
    before = context_snapshot(ctx)
    result = fn(ctx)
    if inspect.isawaitable(result):
        result = await result
    _compare_snapshots(before, context_snapshot(ctx))
    return result


def assert_within_budget(
    request: ModelRequest | Sequence[Message], counter: TokenCounter, limit: int
) -> int:
    """``counter.count_request(request) <= limit``; returns the count.

    ``request`` may be a plain list of messages (counted with ``count_messages``). On
    failure the message names the count, the limit, the excess and the largest messages.
    """
    if not isinstance(counter, TokenCounter):
        raise TypeError(
            f"assert_within_budget: counter must implement tinyctx.tokens.TokenCounter, got "
            f"{type(counter).__name__}"
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"assert_within_budget: limit must be an integer >= 0, got {limit!r}")
    if isinstance(request, ModelRequest):
        messages = request.messages
        count = counter.count_request(request)
        what = "request"
    else:
        messages = tuple(request)
        count = counter.count_messages(messages)
        what = "messages"
    if count > limit:
        sizes = sorted(
            ((counter.count_message(m), i, m.role) for i, m in enumerate(messages)), reverse=True
        )
        largest = ", ".join(f"#{i} {role}: {n}" for n, i, role in sizes[:3]) or "none"
        raise AssertionError(
            f"{what} over budget: {count} tokens > limit {limit} (over by {count - limit}; "
            f"{len(messages)} messages, largest {largest}; counter {type(counter).__name__})"
        )
    return count


def _difference(once: Any, twice: Any) -> str:
    if isinstance(once, Sequence) and isinstance(twice, Sequence) and not isinstance(once, str):
        if len(once) != len(twice):
            return f"length {len(once)} -> {len(twice)}"
        for index, (a, b) in enumerate(zip(once, twice, strict=True)):
            if a != b:
                return f"first difference at index {index}:\n  once:  {a!r}\n  twice: {b!r}"
    return f"\n  once:  {once!r}\n  twice: {twice!r}"


def _check_idempotent(once: T, twice: T) -> T:
    if twice != once:
        raise AssertionError(
            f"not idempotent: applying twice changed the result ({_difference(once, twice)})"
        )
    return once


@overload
def assert_idempotent(fn: Callable[[T], Awaitable[T]], value: T) -> Awaitable[T]: ...
@overload
def assert_idempotent(fn: Callable[[T], T], value: T) -> T: ...
def assert_idempotent(fn: Callable[[T], Any], value: T) -> Any:
    """``fn(fn(value)) == fn(value)``; returns ``fn(value)``.

    ``fn`` may be async: then ``await assert_idempotent(fn, value)``. On failure the
    message shows the first element that changed (for sequences such as histories).
    """
    once = fn(value)
    if inspect.isawaitable(once):
        return _assert_idempotent_async(fn, once)
    return _check_idempotent(once, fn(once))


async def _assert_idempotent_async(fn: Callable[[T], Any], pending: Awaitable[T]) -> T:
    once = await pending
    twice: T = await fn(once)
    return _check_idempotent(once, twice)


def assert_events_form_tree(events: Sequence[Event]) -> None:
    """The events' run ids form one tree: one root, every parent exists, no run has two parents.

    Events must have been emitted through ``ctx.emit`` (which stamps the run's ids).
    """
    if not events:
        return
    for event in events:
        if not event.run_id or not event.root_run_id:
            raise AssertionError(
                f"event {event.kind} carries no run ids: emit it with ctx.emit, not the sink"
            )
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
    # walking up from any run reaches the root without a cycle
    for node in parent_of:
        seen: set[str] = set()
        current: str | None = node
        while current is not None:
            if current in seen:
                raise AssertionError(f"cycle in run tree at {current}")
            seen.add(current)
            current = parent_of.get(current)
        if root not in seen:
            raise AssertionError(f"run {node} does not reach the root")
