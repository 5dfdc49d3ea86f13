"""Checking a model's arguments against an MCP tool's input schema, quickly.

The JSON Schema validator (``jsonschema``) decides. Most servers describe their tools
with flat objects of scalar properties (the SDK's own servers do, from a function's
signature), so for such a schema a small check runs first: the required properties are
present, no unknown one when ``additionalProperties`` is false, each present property of
its JSON type. Whatever it accepts, the validator accepts too (it never checks less);
whatever it refuses goes to the validator, which decides and words the problems.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..frozen import FrozenDict, thaw

__all__ = ["fast_check", "plain_arguments"]

_SCALARS = (str, int, float, bool, type(None))
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated"})
_ROOT_KEYS = frozenset({"type", "properties", "required", "additionalProperties", "$schema"})
_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
}


def plain_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments as plain JSON data (a call's arguments are deep-frozen)."""
    if type(arguments) is FrozenDict:
        data = arguments._data
        if all(type(v) in _SCALARS for v in data.values()):
            return dict(data)
    plain: dict[str, Any] = thaw(arguments)
    return plain


def _property_check(schema: Any) -> Callable[[Any], bool] | None:
    if not isinstance(schema, Mapping) or not set(schema) <= _ANNOTATIONS | {"type"}:
        return None
    wanted = schema.get("type")
    kinds = (wanted,) if isinstance(wanted, str) else wanted
    if not isinstance(kinds, list | tuple) or not kinds:
        return None
    checks = [_TYPES.get(k) for k in kinds if isinstance(k, str)]
    if len(checks) != len(kinds) or any(c is None for c in checks):
        return None
    if len(checks) == 1:
        only = checks[0]
        assert only is not None
        return only
    found = [c for c in checks if c is not None]
    return lambda v: any(c(v) for c in found)


def fast_check(schema: Mapping[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """A check that accepts only arguments the validator accepts, for a flat object of
    scalar properties; None for any other schema (the validator alone decides)."""
    if not set(schema) <= _ROOT_KEYS | _ANNOTATIONS or schema.get("type") != "object":
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, Mapping) or not isinstance(required, list | tuple):
        return None
    if not isinstance(extra, bool) or not all(isinstance(n, str) for n in required):
        return None
    checks: dict[str, Callable[[Any], bool]] = {}
    for name, prop in properties.items():
        check = _property_check(prop)
        if check is None:
            return None
        checks[name] = check
    needed = tuple(required)
    closed = extra is False

    def accepts(arguments: dict[str, Any]) -> bool:
        for name in needed:
            if name not in arguments:
                return False
        for name, value in arguments.items():
            check = checks.get(name)
            if check is None:
                if closed:
                    return False
            elif not check(value):
                return False
        return True

    return accepts
