"""Testing tools for tinyctx users (and tinyctx itself): fakes, capture, one-layer drivers.

Import-light: hypothesis is only imported by :mod:`tinyctx.testing.strategies` and
:mod:`tinyctx.testing.stateful`, so this module works without the ``testing`` extra.

- Fakes: :class:`ScriptedModel` (plays responses, streams, failures, hangs),
  :func:`stream`, :class:`EchoModel`, :class:`FakeTool`, :func:`reply`, :func:`call`.
- Capture and drivers: :func:`capture_events`, :func:`quiet_context`, :func:`run_layer`,
  :func:`run_tool_layer`.
- Invariants: :func:`assert_pairing_intact`, :func:`assert_parent_unchanged`,
  :func:`assert_within_budget`, :func:`assert_idempotent`, :func:`assert_events_form_tree`.
"""

from __future__ import annotations

from ._fakes import (
    HANG,
    MODEL_CALL_CHECKPOINT,
    STREAM_CHECKPOINT,
    TOOL_CALL_CHECKPOINT,
    EchoModel,
    FakeTool,
    ScriptedModel,
    ScriptExhausted,
    Stream,
    assemble_stream,
    call,
    capture_events,
    quiet_context,
    reply,
    run_layer,
    run_tool_layer,
    stream,
)
from .invariants import (
    assert_events_form_tree,
    assert_idempotent,
    assert_pairing_intact,
    assert_parent_unchanged,
    assert_within_budget,
)

__all__ = [
    "HANG",
    "MODEL_CALL_CHECKPOINT",
    "STREAM_CHECKPOINT",
    "TOOL_CALL_CHECKPOINT",
    "ScriptedModel",
    "ScriptExhausted",
    "Stream",
    "stream",
    "assemble_stream",
    "EchoModel",
    "FakeTool",
    "reply",
    "call",
    "capture_events",
    "quiet_context",
    "run_layer",
    "run_tool_layer",
    "assert_pairing_intact",
    "assert_parent_unchanged",
    "assert_within_budget",
    "assert_idempotent",
    "assert_events_form_tree",
]
