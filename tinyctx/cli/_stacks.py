"""Stacks and layers by name, through entry points (``tinyctx.stacks``, ``tinyctx.layers``)."""

from __future__ import annotations

import inspect
import tomllib
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..chain import LayerLike
from ..errors import ConfigError, TinyCtxError
from ..ordering import OrderingError, check_ordering
from ..tokens import TokenCounter

if TYPE_CHECKING:  # the command imports the cost module only when it prices
    pass


class StackError(TinyCtxError, ValueError):
    """A stack file or name that cannot be built; the message names the file and place."""


def _entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


StackFactory = Callable[..., Sequence[LayerLike]]


def _build(name: str, args: dict[str, Any], where: str, counter: TokenCounter | None = None) -> Any:
    layers = _entry_points("tinyctx.layers")
    if name not in layers:
        known = ", ".join(sorted(layers)) or "none installed"
        raise StackError(f"{where}: unknown layer {name!r} (known: {known})")
    factory = layers[name].load()
    nested = args.pop("policies", None)
    if nested is not None:
        if not isinstance(nested, list):
            raise StackError(f"{where}: 'policies' must be an array of tables")
        args["policies"] = [
            _build(_use(p, f"{where}.policies[{i}]"), _args(p), f"{where}.policies[{i}]", counter)
            for i, p in enumerate(nested)
        ]
    if counter is not None and "counter" not in args and _accepts(factory, "counter"):
        args["counter"] = counter  # count with the command's tokenizer unless told otherwise
    try:
        return factory(**args)
    except (ConfigError, TypeError, ValueError) as exc:
        raise StackError(f"{where} ({name}): {exc}") from None


def _accepts(factory: Any, parameter: str) -> bool:
    try:
        return parameter in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def _use(table: Any, where: str) -> str:
    if not isinstance(table, dict) or not isinstance(table.get("use"), str):
        raise StackError(f"{where}: each entry needs a string 'use' naming a layer")
    name: str = table["use"]
    return name


def _args(table: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in table.items() if k != "use"}


def load_stack(spec: str, *, counter: TokenCounter | None = None) -> list[LayerLike]:
    """A stack by name (``default``, ``seed-order``, any ``tinyctx.stacks`` entry point) or
    from a TOML file: ``[[layers]]`` tables with ``use = "<layer name>"`` and arguments."""
    stacks = _entry_points("tinyctx.stacks")
    if spec in stacks:
        factory: StackFactory = stacks[spec].load()
        named = list(factory(counter=counter))
        _check_order(named, f"--stack {spec}")
        return named
    path = Path(spec)
    if not path.is_file():
        known = ", ".join(sorted(stacks)) or "none installed"
        raise StackError(f"--stack {spec!r}: not a stack name ({known}) and no such file")
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise StackError(f"{path}: invalid TOML: {exc}") from None
    unknown = set(document) - {"layers"}
    if unknown:
        raise StackError(f"{path}: unknown top-level keys {sorted(unknown)}; expected [[layers]]")
    tables = document.get("layers")
    if not isinstance(tables, list) or not tables:
        raise StackError(f"{path}: expected one or more [[layers]] tables")
    stack = [
        _build(_use(t, f"{path}: layers[{i}]"), _args(t), f"{path}: layers[{i}]", counter)
        for i, t in enumerate(tables)
    ]
    _check_order(stack, str(path))
    return stack


def load_stack_at(
    spec: str,
    low_water: float,
    *,
    counter: TokenCounter | None = None,
    relief_run: int | None = None,
) -> list[LayerLike]:
    """``spec`` with its budget guard's low-water mark set to ``low_water`` (for sweeps): a
    named stack whose factory takes ``low_water``, or a TOML file whose ``budget_guard``
    layers get ``low_water`` (replacing any ``target``/``low_water`` they set). A
    ``relief_run`` other than None replaces the guard's relief run the same way.

    Args:
        spec: A stack's name or the path of a stack file.
        low_water: The budget guard's low-water mark, a fraction of the window.
        counter: The token counter the layers count with (the default one when None).
        relief_run: The guard's relief run, or None to keep the stack's.
    """
    stacks = _entry_points("tinyctx.stacks")
    if spec in stacks:
        factory: StackFactory = stacks[spec].load()
        if not _accepts(factory, "low_water"):
            raise StackError(f"--sweep: stack {spec!r} has no low_water knob to sweep")
        if relief_run is None:
            return list(factory(counter=counter, low_water=low_water))
        if not _accepts(factory, "relief_run"):
            raise StackError(f"--sweep: stack {spec!r} has no relief_run to set")
        return list(factory(counter=counter, low_water=low_water, relief_run=relief_run))
    path = Path(spec)
    load_stack(spec, counter=counter)  # the file, validated as it is
    tables = tomllib.loads(path.read_text(encoding="utf-8"))["layers"]
    if not any(t.get("use") == "budget_guard" for t in tables):
        raise StackError(f"--sweep: {path} has no budget_guard layer whose low_water to sweep")
    for t in tables:
        if t.get("use") == "budget_guard":
            t.pop("target", None)
            t["low_water"] = low_water
            if relief_run is not None:
                t["relief_run"] = relief_run
    return [
        _build(_use(t, f"{path}: layers[{i}]"), _args(t), f"{path}: layers[{i}]", counter)
        for i, t in enumerate(tables)
    ]


def _check_order(stack: Sequence[LayerLike], where: str) -> None:
    """Declared ordering rules are checked before anything replays (never reordered)."""
    try:
        check_ordering(stack)
    except OrderingError as exc:
        raise StackError(f"{where}: {exc}") from None
