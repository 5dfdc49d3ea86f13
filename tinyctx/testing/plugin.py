"""The pytest plugin's fixtures, under their documented ``tinyctx.testing`` name.

pytest loads them from the top-level module ``_tinyctx_pytest`` (entry point ``pytest11``,
name ``tinyctx``), which imports nothing of tinyctx until a fixture is used; this module
re-exports them for ``pytest_plugins = ["tinyctx.testing.plugin"]`` in a checkout that
does not install the entry point.
"""

from __future__ import annotations

from _tinyctx_pytest import captured_events, scripted_model, tinyctx_ctx

__all__ = ["tinyctx_ctx", "scripted_model", "captured_events"]
