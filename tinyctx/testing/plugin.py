"""pytest plugin (entry point ``pytest11``): fixtures for testing tinyctx layers.

Import-light on purpose: pytest loads it in every project that has tinyctx installed, so
it imports nothing heavy at module level and never configures logging.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["tinyctx_ctx", "scripted_model", "captured_events"]


@pytest.fixture
def tinyctx_ctx() -> Any:
    """A fresh root ``RunContext`` (events not logged, so test output stays clean)."""
    from tinyctx import EventSink, RunContext

    return RunContext.new(events=EventSink(logger=None))


@pytest.fixture
def scripted_model() -> Any:
    """An empty ``ScriptedModel``; add responses with ``scripted_model.add(...)``."""
    from tinyctx.testing import ScriptedModel

    return ScriptedModel()


@pytest.fixture
def captured_events() -> Iterator[list[Any]]:
    """Every tinyctx event emitted during the test, in order."""
    from tinyctx.testing import capture_events

    with capture_events() as events:
        yield events
