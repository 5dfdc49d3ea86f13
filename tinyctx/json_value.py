"""Python values as JSON values: what a tool's default and a schema's ``const`` may be."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .frozen import thaw

__all__ = ["json_key", "shown_value", "to_json_value"]


def json_key(value: Any) -> Any:
    """A hashable key with JSON equality: ``1 == 1.0``, ``true != 1``."""
    if value is None:
        return ("null",)
    if value is True or value is False:
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", value)
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, Mapping):
        return ("obj", frozenset((k, json_key(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("arr", tuple(json_key(v) for v in value))
    return ("other", id(value))


def shown_value(value: Any) -> str:
    try:
        text = json.dumps(thaw(value), ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def to_json_value(value: Any, fallback: Callable[[Any], Any] | None = None) -> Any:
    """``value`` as plain JSON data: enums by value, attrs classes, dataclasses and mappings
    as objects, sequences and sets as arrays. Anything else goes to ``fallback`` (or
    raises TypeError)."""
    if isinstance(value, enum.Enum):  # before str/int: StrEnum and IntEnum are both
        return to_json_value(value.value, fallback)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    cls = type(value)
    if attrs.has(cls):
        return {
            a.alias: to_json_value(getattr(value, a.name), fallback)
            for a in attrs.fields(cls)
            if a.init
        }
    if dataclasses.is_dataclass(value):
        return {
            f.name: to_json_value(getattr(value, f.name), fallback)
            for f in dataclasses.fields(value)
        }
    if isinstance(value, Mapping):
        return {str(k): to_json_value(v, fallback) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v, fallback) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [to_json_value(v, fallback) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if fallback is not None:
        return fallback(value)
    raise TypeError(f"{cls.__name__} is not JSON data")
