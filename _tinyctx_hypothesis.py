"""tinyctx's ``hypothesis`` entry point: ``st.from_type`` builds valid tinyctx values.

A top-level module on purpose: hypothesis runs the hook whenever it is imported, in every
project installed beside tinyctx, and importing anything under ``tinyctx.`` would first run
``tinyctx/__init__`` (most of the kernel). So the hook imports nothing of tinyctx unless
tinyctx is already imported:

- tinyctx already imported: register now (:mod:`tinyctx.testing._hypothesis_hook`);
- tinyctx not imported yet, or importing right now: nothing; the end of
  ``tinyctx/__init__`` registers when it sees hypothesis loaded, so the types are
  registered before anyone can name one.

Set ``HYPOTHESIS_NO_PLUGINS=1`` to skip the hook.
"""

from __future__ import annotations

import sys

__all__: list[str] = []


def _hypothesis_setup_hook() -> None:
    """Called by hypothesis when it is imported (entry point group ``hypothesis``)."""
    module = sys.modules.get("tinyctx")
    if module is None or getattr(module.__spec__, "_initializing", False):
        return
    from tinyctx.testing._hypothesis_hook import register_strategies

    register_strategies()
