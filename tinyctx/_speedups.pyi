"""The codec's fast reader, in C (see _speedups.c); configured by tinyctx.codec."""

from collections.abc import Callable, Sequence
from typing import Any

def configure(
    *,
    empty: object,
    frozen_dict: tuple[type, tuple[Any, ...]],
    tool_call: tuple[type, tuple[Any, ...]],
    tool_result: tuple[type, tuple[Any, ...]],
    assistant: tuple[type, tuple[Any, ...]],
    user: tuple[type, tuple[Any, ...]],
    system: tuple[type, tuple[Any, ...]],
    tool_keys: frozenset[str],
    assistant_keys: frozenset[str],
    text_keys: frozenset[str],
    call_keys: frozenset[str],
    version: int,
    text_hole: str,
    max_depth: int,
    loads: Callable[[str], Any],
) -> None: ...
def read_rows(rows: Sequence[Any], /) -> list[Any]: ...
