"""The results a run gives tool calls it will not run, so pairing always holds."""

from __future__ import annotations

__all__ = ["SKIPPED_ON_ABANDON", "SKIPPED_ON_CANCEL", "SKIPPED_ON_CRASH", "SKIPPED_ON_STOP"]

SKIPPED_ON_STOP = "[skipped: the run was stopped with a final answer before this tool ran]"
SKIPPED_ON_CANCEL = "[not run: the run was cancelled before this tool ran]"
SKIPPED_ON_ABANDON = "[not run: the run was interrupted and not resumed]"
SKIPPED_ON_CRASH = (
    "[interrupted: the worker running this step stopped before its result was saved; "
    "the call may or may not have run]"
)
