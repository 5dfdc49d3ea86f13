"""A cold count's per-message loop, in C (see _token_speedups.c); used by tinyctx.tokens."""

from collections.abc import Callable
from typing import Any

def measure(
    messages: tuple[Any, ...],
    kinds: tuple[type, type, type],
    shape: bool,
    rates: tuple[float, ...],
    one_token: bytes | None,
    base: int,
    per_call: int,
    exact_to: int,
    arguments: Callable[[Any], int],
) -> tuple[list[int], list[int]]: ...
