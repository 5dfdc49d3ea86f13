"""The ``hypothesis`` entry point: register tinyctx's strategies for ``st.from_type``.

Hypothesis calls :func:`_hypothesis_setup_hook` when it is imported, so
``st.from_type(ToolResult)`` builds valid values in any test, without importing
:mod:`tinyctx.testing.strategies` first. Set ``HYPOTHESIS_NO_PLUGINS=1`` to skip it.
"""

from __future__ import annotations

import importlib
import sys

_STRATEGIES = "tinyctx.testing.strategies"


def _hypothesis_setup_hook() -> None:
    # the strategies module registers itself when imported. If it is already in
    # sys.modules it has registered, or it is importing hypothesis right now (that is how
    # we got here) and registers when its own import finishes.
    if _STRATEGIES not in sys.modules:
        importlib.import_module(_STRATEGIES)
