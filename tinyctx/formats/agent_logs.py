"""Evaluation logs that hold several runs (read only): OpenHands ``output.jsonl`` and
tau-bench result JSON.

An OpenHands evaluation writes one JSON record per instance (``instance_id``,
``instruction``, ``history``, ``metrics``, ``test_result``...). ``history`` is the event
stream of the run: ``action`` events (the ``system`` prompt, ``message`` from the user or
the agent, and tool actions carrying ``tool_call_metadata`` with the LLM's
``model_response``) and ``observation`` events answering a tool call through the same
metadata. The model's view is rebuilt the way OpenHands builds it: one assistant message per
LLM response (its text and every tool call), one tool result per observation. Other events
(state changes, recalls) are the agent's bookkeeping and are skipped.

A tau-bench result file is a JSON list of tasks (``task_id``, ``reward``, ``info``,
``trial``, ``traj``); ``traj`` is the conversation as OpenAI chat messages.

Both hold several runs: ``record`` picks one (from 0); the others stay in the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..messages import Message
from ._common import FormatError
from .openai import from_openai

__all__ = [
    "OPENHANDS",
    "TAU_BENCH",
    "is_openhands_record",
    "is_tau_bench_record",
    "from_openhands",
    "from_tau_bench",
    "select_record",
]

OPENHANDS: Final = "openhands"
TAU_BENCH: Final = "tau_bench"


def is_openhands_record(value: Any) -> bool:
    """An OpenHands evaluation record: ``history`` is a list of events with a ``source``."""
    if not isinstance(value, Mapping):
        return False
    history = value.get("history")
    return isinstance(history, list) and (
        "instance_id" in value
        or any(isinstance(e, Mapping) and "source" in e and "id" in e for e in history[:5])
    )


def is_tau_bench_record(value: Any) -> bool:
    """A tau-bench task result: a ``traj`` list of messages beside ``task_id``/``reward``."""
    return (
        isinstance(value, Mapping)
        and isinstance(value.get("traj"), list)
        and ("task_id" in value or "reward" in value)
    )


def select_record(document: Any, record: int, fmt: str) -> Mapping[str, Any]:
    """Run number ``record`` of a file holding one record or a list of them."""
    records = document if isinstance(document, list) else [document]
    if not records:
        raise FormatError("the file holds no record", format=fmt)
    if not -len(records) <= record < len(records):
        raise FormatError(
            f"record {record} does not exist "
            f"(the file holds {len(records)}: 0..{len(records) - 1})",
            format=fmt,
        )
    chosen = records[record]
    if not isinstance(chosen, Mapping):
        kind = type(chosen).__name__
        raise FormatError(f"record {record} is a {kind}, not an object", format=fmt)
    return chosen


def _tool_call(event: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI tool call of an action whose model response was not kept in the log."""
    args = _args(event)
    kept = {k: v for k, v in args.items() if k not in ("thought", "is_input", "blocking")}
    return {
        "id": str(meta.get("tool_call_id", "")),
        "type": "function",
        "function": {"name": str(meta.get("function_name", "")), "arguments": json.dumps(kept)},
    }


def _args(event: Mapping[str, Any]) -> Mapping[str, Any]:
    args = event.get("args")
    return args if isinstance(args, Mapping) else {}


def _response_message(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    response = meta.get("model_response")
    if not isinstance(response, Mapping):
        return None
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, Mapping) else None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: keep the text
        parts = [p for p in value if isinstance(p, Mapping) and p.get("type") == "text"]
        return "".join(str(p.get("text", "")) for p in parts)
    return "" if value is None else str(value)


def openhands_messages(history: Sequence[Any]) -> list[dict[str, Any]]:
    """The OpenAI chat messages the model saw in an OpenHands event ``history``."""
    out: list[dict[str, Any]] = []
    responses: dict[str, dict[str, Any]] = {}  # model response id -> its assistant message
    for index, event in enumerate(history):
        if not isinstance(event, Mapping):
            raise FormatError(f"event {index} is not an object", format=OPENHANDS, index=index)
        meta = event.get("tool_call_metadata")
        args = _args(event)
        if "observation" in event:
            if isinstance(meta, Mapping) and meta.get("tool_call_id"):
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(meta["tool_call_id"]),
                        "name": str(meta.get("function_name", "")),
                        "content": _text(event.get("content")),
                    }
                )
            continue
        action = event.get("action")
        if action is None:
            continue
        if isinstance(meta, Mapping) and meta.get("tool_call_id"):
            response = meta.get("model_response")
            key = (
                str(response.get("id"))
                if isinstance(response, Mapping) and response.get("id")
                else f"event-{index}"
            )
            if key in responses:
                continue  # another tool call of a response already written whole
            message = _response_message(meta)
            if message is not None and message.get("tool_calls"):
                assistant = {
                    "role": "assistant",
                    "content": _text(message.get("content")),
                    "tool_calls": list(message["tool_calls"]),
                }
            else:
                assistant = {
                    "role": "assistant",
                    "content": _text(args.get("thought")),
                    "tool_calls": [_tool_call(event, meta)],
                }
            responses[key] = assistant
            out.append(assistant)
        elif action == "system":
            out.append({"role": "system", "content": _text(args.get("content"))})
        elif action == "message":
            role = "user" if event.get("source") == "user" else "assistant"
            out.append({"role": role, "content": _text(args.get("content", event.get("message")))})
    return out


def from_openhands(record: Mapping[str, Any]) -> tuple[Message, ...]:
    """The messages of one OpenHands evaluation record (see the module docstring)."""
    history = record.get("history")
    if not isinstance(history, list):
        raise FormatError("the record has no 'history' list", format=OPENHANDS)
    return from_openai(openhands_messages(history))


def from_tau_bench(record: Mapping[str, Any]) -> tuple[Message, ...]:
    """The messages of one tau-bench task result (its ``traj`` of OpenAI messages)."""
    traj = record.get("traj")
    if not isinstance(traj, list):
        raise FormatError("the record has no 'traj' list", format=TAU_BENCH)
    return from_openai(traj)
