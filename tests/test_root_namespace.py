"""The root namespaces: what `tinyctx` and `tinyctx.middleware` export, and what it costs."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import tinyctx
import tinyctx.middleware


def _fresh(code: str) -> str:
    """stdout of ``code`` run in a new interpreter (nothing imported yet)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout.strip()


def _same_as_defined(value: object, name: str) -> None:
    """``value`` is the object the module defining it has under ``name`` (a type alias, whose
    ``__module__`` is typing's, is checked by identity against the root alone)."""
    home = getattr(value, "__module__", "") or ""
    if home.startswith("tinyctx"):
        assert getattr(importlib.import_module(home), name) is value
    else:
        assert value is not None


class TestRootNames:
    """Every root name imports from the root and is the object its own module defines."""

    @pytest.mark.parametrize("name", tinyctx.__all__)
    def test_name_is_its_modules_object(self, name: str) -> None:
        names: dict[str, object] = {}
        exec(f"from tinyctx import {name} as value", names)  # noqa: S102
        _same_as_defined(names["value"], name)

    def test_star_import_gives_the_listed_names(self) -> None:
        names: dict[str, object] = {}
        exec("from tinyctx import *", names)  # noqa: S102 - the statement under test
        assert set(names) - {"__builtins__"} == set(tinyctx.__all__)

    def test_a_name_that_left_the_root_is_not_found_there(self) -> None:
        # moved for real: only its own module has it
        with pytest.raises(AttributeError, match="encode_messages"):
            _ = tinyctx.encode_messages  # type: ignore[attr-defined]
        with pytest.raises(ImportError):
            exec("from tinyctx import check_pairing", {})  # noqa: S102
        from tinyctx.codec import encode_messages
        from tinyctx.messages import check_pairing

        assert callable(encode_messages) and callable(check_pairing)

    def test_dir_lists_the_root_names(self) -> None:
        assert set(tinyctx.__all__) <= set(dir(tinyctx))


class TestMiddlewareNames:
    """`tinyctx.middleware` exports the layers and their settings; events live beside them."""

    @pytest.mark.parametrize("name", tinyctx.middleware.__all__)
    def test_name_is_its_modules_object(self, name: str) -> None:
        _same_as_defined(getattr(tinyctx.middleware, name), name)

    def test_an_event_class_is_imported_from_its_layers_module(self) -> None:
        from tinyctx.events import Event
        from tinyctx.middleware.budget import ContextPolicyApplied

        assert "ContextPolicyApplied" not in tinyctx.middleware.__all__
        assert issubclass(ContextPolicyApplied, Event)


class TestImportCost:
    """`import tinyctx` loads no submodule and no logging stack until a name is used."""

    def test_import_loads_only_the_package(self) -> None:
        loaded = _fresh(
            "import sys, tinyctx\n"
            "print(sorted(m for m in sys.modules if m.startswith(('tinyctx', 'structlog',"
            " 'rich', 'asyncio'))))"
        )
        assert loaded == "['tinyctx']"

    def test_an_agent_does_not_load_structlog(self) -> None:
        # structlog (asyncio, rich) is looked up when events are logged, never imported
        loaded = _fresh(
            "import sys\nfrom tinyctx import Agent, Session, tool\n"
            "print(sorted(m for m in ('structlog', 'rich', 'asyncio') if m in sys.modules))"
        )
        assert loaded == "[]"


class TestCommandExtra:
    """Without rich (the `cli` extra) the command says what to install."""

    def test_missing_rich_names_the_extra(self) -> None:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys\nsys.modules['rich'] = None  # as if the extra were not installed\n"
                "from tinyctx.cli import main\nmain(['stats'])",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode != 0
        assert "pip install 'tinyctx[cli]'" in done.stderr
