"""Classes defined in a private module keep the public module they are imported from.

For a package split into private modules behind one public module (as tinyctx's own
codec, tokens and budget are): call ``publish(__name__, _part, ...)`` at the end of the
public module, after its imports.
"""

from __future__ import annotations

import sys
from types import ModuleType

__all__ = ["publish"]


def publish(module: str, *sources: ModuleType) -> None:
    """Give the public classes defined in ``sources`` the ``__module__`` of the public module
    that re-exports them, as before it was split: reprs, pickles and tracebacks show the
    import path users write, and the command names an event by the layer class beside it."""
    exported = vars(sys.modules[module])
    for source in sources:
        for name, value in vars(source).items():
            public = isinstance(value, type) and not name.startswith("_")
            if public and value.__module__ == source.__name__ and exported.get(name) is value:
                value.__module__ = module
