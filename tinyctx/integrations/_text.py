"""A framework tool's output as the text a tinyctx tool result holds."""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import to_jsonable_python

__all__ = ["json_text"]


def json_text(value: Any) -> str:
    """``value`` as JSON text (pydantic models and dataclasses too), else its ``str``."""
    try:
        return json.dumps(to_jsonable_python(value), ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)
