"""The C reader's glue.

``tinyctx._speedups`` configured with the fast reader's classes, slots and key sets.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Final

from ._codec_base import (
    CODEC_VERSION,
    _orjson_loads,
)
from ._codec_fast import (
    _ASSISTANT_SLOTS,
    _CALL_SLOTS,
    _FAST,
    _SYSTEM_SLOTS,
    _TOOL_SLOTS,
    _USER_SLOTS,
    _slots,
)
from ._codec_strict import (
    _ASSISTANT_KEYS,
    _CALL_KEYS,
    _TEXT_KEYS,
    _TOOL_KEYS,
)
from .documents import TEXT_HOLE
from .frozen import (
    EMPTY,
    MAX_NESTING,
    FrozenDict,
)
from .messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult, UserMessage


def _c_reader() -> Callable[[Sequence[Any]], list[Message | None]] | None:
    """The fast reader in C (``tinyctx._speedups``), given this reader's classes, slots and
    key sets; None where it was not built (no C compiler at install), where
    ``TINYCTX_NO_EXTENSIONS`` is set, or where the fast reader is off."""
    if not _FAST or _orjson_loads is None or os.environ.get("TINYCTX_NO_EXTENSIONS"):
        return None
    try:
        from . import _speedups
    except ImportError:  # pragma: no cover - installed where no C compiler was found
        return None
    _speedups.configure(
        empty=EMPTY,
        frozen_dict=(FrozenDict, _slots(FrozenDict, ("_data", "_hash", "_json_chars"))),
        tool_call=(ToolCall, _CALL_SLOTS),
        tool_result=(ToolResult, _TOOL_SLOTS),
        assistant=(AssistantMessage, _ASSISTANT_SLOTS),
        user=(UserMessage, _USER_SLOTS),
        system=(SystemMessage, _SYSTEM_SLOTS),
        tool_keys=_TOOL_KEYS,
        assistant_keys=_ASSISTANT_KEYS,
        text_keys=_TEXT_KEYS,
        call_keys=_CALL_KEYS,
        version=CODEC_VERSION,
        text_hole=TEXT_HOLE,
        max_depth=MAX_NESTING,
        loads=_orjson_loads,
    )
    return _speedups.read_rows


_read_rows: Final = _c_reader()
C_READER: Final = _read_rows is not None
