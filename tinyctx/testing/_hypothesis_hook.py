"""Register tinyctx's strategies for ``st.from_type``, once hypothesis and tinyctx are loaded.

Two callers, whichever comes second: the ``hypothesis`` entry point
(``_tinyctx_hypothesis``, a top-level module that imports nothing of tinyctx) when tinyctx
was imported first, and the end of ``tinyctx/__init__`` when hypothesis was. So
``st.from_type(ToolResult)`` builds valid values in any test, without importing
:mod:`tinyctx.testing.strategies` first, and a project that never imports tinyctx pays
nothing. Set ``HYPOTHESIS_NO_PLUGINS=1`` to skip it.
"""

from __future__ import annotations

import importlib
import os
import sys

__all__ = ["register_strategies", "register_if_hypothesis_loaded"]

_STRATEGIES = "tinyctx.testing.strategies"


def register_strategies() -> None:
    """Import the strategies module, which registers itself with hypothesis."""
    # If it is already in sys.modules it has registered, or it is importing hypothesis
    # right now (that is how the hook got called) and registers when its import finishes.
    if _STRATEGIES not in sys.modules:
        importlib.import_module(_STRATEGIES)


def register_if_hypothesis_loaded() -> None:
    """Called at the end of ``tinyctx/__init__``: register if hypothesis was imported first."""
    if sys.modules.get("hypothesis") is not None and not os.environ.get("HYPOTHESIS_NO_PLUGINS"):
        register_strategies()
