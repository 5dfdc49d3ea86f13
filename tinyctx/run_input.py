"""A run's input: text, a message or messages, checked to keep pairing before it is added."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .conversation import last_turn_start
from .errors import PairingError
from .messages import (
    AssistantMessage,
    Message,
    ToolResult,
    UserMessage,
    answer_pending,
    call_ids,
    check_messages,
    check_pairing,
    pending_tool_calls,
)
from .synthetic import SKIPPED_ON_ABANDON

__all__ = ["check_input", "check_turn_input", "input_messages"]

_PAIRED = (AssistantMessage, ToolResult)
"""The messages pairing is about (an assistant message may carry calls)."""


def check_input(
    history: tuple[Message, ...],
    messages: tuple[Message, ...],
    used: set[str] | Callable[[], set[str]],
    *,
    paused: bool,
) -> None:
    """The history after ``messages`` are added must keep the pairing rule with no call left
    unanswered (the model is called next): else a PairingError naming ``input[i]`` and the
    id, raised before anything is appended. A pause's pending calls are about to be answered
    as abandoned, so they count as answered.

    The history before its last assistant message is paired already (the loop and
    ``Conversation.replace`` keep it so), so only that tail is checked with the input, and
    the input's call ids against ``used``, the ids of the whole history: the cost grows
    with the input, not with the thread.

    Args:
        history: The conversation's messages now.
        messages: The input to add.
        used: Every call id of ``history`` (or what returns them, called when needed).
        paused: Whether a pause's (or a dead worker's) pending calls are answered first.
    """
    start = last_turn_start(history)
    check_turn_input(start, history[start:], messages, used, paused=paused)


def check_turn_input(
    start: int,
    tail: tuple[Message, ...],
    messages: tuple[Message, ...],
    used: set[str] | Callable[[], set[str]],
    *,
    paused: bool,
) -> None:
    """:func:`check_input` given the history's last turn: ``tail``, from index ``start``
    (``Conversation.last_turn()``, which does not copy the whole history).

    Args:
        start: The index of ``tail``'s first message in the history.
        tail: The history from ``start`` on.
        messages: The input to add.
        used: Every call id of the history (or what returns them, called when needed).
        paused: Whether a pause's (or a dead worker's) pending calls are answered first.
    """
    if _pairs_nothing(messages, tail):
        return  # no call and no result on either side: nothing that pairing could break
    if not messages and not pending_tool_calls(tail):
        return
    answered = answer_pending(tail, SKIPPED_ON_ABANDON) if paused else ()
    if not isinstance(used, set):
        used = used()
    recent = call_ids(tail)  # not ``used - recent``: that would copy every id of the thread
    offset = len(tail) + len(answered)
    try:
        for index, message in enumerate(messages):
            if isinstance(message, AssistantMessage):
                for call in message.tool_calls:
                    if call.id in used and call.id not in recent:
                        raise PairingError(
                            f"duplicate tool call id {call.id!r} at index {offset + index}: "
                            "the thread used it already",
                            index=offset + index,
                            tool_call_id=call.id,
                        )
        check_pairing((*tail, *answered, *messages), allow_pending=False)
    except PairingError as exc:
        index = exc.index - offset
        if index < 0:
            raise PairingError(
                f"history[{start + exc.index}]: {exc}",
                index=start + exc.index,
                tool_call_id=exc.tool_call_id,
            ) from None
        raise PairingError(
            f"input[{index}]: {exc}", index=index, tool_call_id=exc.tool_call_id
        ) from None


def _pairs_nothing(messages: tuple[Message, ...], tail: tuple[Message, ...]) -> bool:
    """No message of the input is one pairing is about, and the tail holds no call and no
    result (plain loops: this runs on every run's input)."""
    for message in messages:
        if isinstance(message, _PAIRED):
            return False
    for message in tail:
        if isinstance(message, ToolResult) or (
            isinstance(message, AssistantMessage) and message.tool_calls
        ):
            return False
    return True


def input_messages(input: str | Message | Sequence[Message] | None) -> tuple[Message, ...]:
    if input is None:
        return ()
    if isinstance(input, str):
        return (UserMessage(input),)
    if isinstance(input, Message):
        return (input,)
    messages = tuple(input)
    check_messages(messages, "input")
    return messages
