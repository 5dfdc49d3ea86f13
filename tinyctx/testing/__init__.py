"""Testing tools for tinyctx users (and tinyctx itself): fakes, capture, one-layer drivers.

Import-light: hypothesis is only imported by :mod:`tinyctx.testing.strategies` and the
stateful template, so this module works without the ``testing`` extra.
"""

from __future__ import annotations

from ._fakes import (
    HANG,
    EchoModel,
    FakeTool,
    ScriptedModel,
    ScriptExhausted,
    call,
    capture_events,
    reply,
    run_layer,
    run_tool_layer,
)
from .invariants import (
    assert_events_form_tree,
    assert_idempotent,
    assert_pairing_intact,
    assert_parent_unchanged,
)

__all__ = [
    "HANG",
    "ScriptedModel",
    "ScriptExhausted",
    "EchoModel",
    "FakeTool",
    "reply",
    "call",
    "capture_events",
    "run_layer",
    "run_tool_layer",
    "assert_pairing_intact",
    "assert_parent_unchanged",
    "assert_idempotent",
    "assert_events_form_tree",
]
