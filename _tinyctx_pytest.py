"""tinyctx's pytest plugin (entry point ``pytest11``, name ``tinyctx``): its fixtures.

A top-level module on purpose: pytest loads it in every project installed beside tinyctx,
and importing anything under ``tinyctx.`` would first run ``tinyctx/__init__`` (most of the
kernel). This module imports only pytest; each fixture imports what it needs when a test
asks for it. Disable the plugin with ``-p no:tinyctx``. The fixtures are plain (sync)
fixtures, so they serve async tests on trio and asyncio alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tinyctx import Event, RunContext
    from tinyctx.testing import ScriptedModel

__all__ = ["tinyctx_ctx", "scripted_model", "captured_events"]


@pytest.fixture
def tinyctx_ctx() -> RunContext[None]:
    """A fresh root ``RunContext`` with an empty conversation; events are not logged
    (they still reach subscribers and ``captured_events``)."""
    from tinyctx.testing import quiet_context

    return quiet_context()


@pytest.fixture
def scripted_model() -> ScriptedModel:
    """An empty ``ScriptedModel``; add responses with ``scripted_model.add(...)``."""
    from tinyctx.testing import ScriptedModel

    return ScriptedModel()


@pytest.fixture
def captured_events() -> Iterator[list[Event]]:
    """Every tinyctx event emitted during the test, in order (from any sink)."""
    from tinyctx.testing import capture_events

    with capture_events() as events:
        yield events
