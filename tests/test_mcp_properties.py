"""Invariants of the MCP integration that need no server: schema checks, content, the registry."""

from __future__ import annotations

import base64
from typing import Any

import mcp.types as mt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from tinyctx import RunContext, TextPart, tool
from tinyctx.frozen import freeze
from tinyctx.mcp import MCPServerStdio, MCPTool, MCPToolConflict, MCPTools, content_to_parts
from tinyctx.mcp._content import parts_or_text
from tinyctx.mcp._schema import fast_check
from tinyctx.mcp._tool import build_tool
from tinyctx.parts import PART_TYPES
from tinyctx.testing.images import png
from tinyctx.tools import ToolArgumentError

SCALAR_TYPES = ["string", "integer", "number", "boolean", "null"]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=3),
)
names = st.sampled_from(["a", "b", "c", "d"])


@st.composite
def flat_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """Flat object schemas of scalar properties, as SDK servers write them, sometimes
    with a keyword the quick check does not know (so the validator alone decides)."""
    properties: dict[str, Any] = {}
    for name in draw(st.lists(names, unique=True, max_size=4)):
        kinds = draw(st.lists(st.sampled_from(SCALAR_TYPES), min_size=1, max_size=2, unique=True))
        prop: dict[str, Any] = {"type": kinds[0] if len(kinds) == 1 else kinds, "title": name}
        if draw(st.booleans()):
            prop["default"] = draw(scalars)
        if draw(st.integers(0, 9)) == 0:
            prop["minimum"] = 0
        properties[name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    schema["required"] = draw(st.lists(st.sampled_from(sorted(properties) or ["a"]), unique=True))
    if draw(st.booleans()):
        schema["additionalProperties"] = draw(st.booleans())
    return schema


arguments = st.dictionaries(names, st.one_of(scalars, st.lists(scalars, max_size=2)), max_size=4)


def remote(name: str, schema: dict[str, Any] | None = None) -> mt.Tool:
    return mt.Tool(name=name, input_schema=schema or {"type": "object", "properties": {}})


class TestSchemaChecks:
    """An MCP tool accepts exactly the arguments its JSON Schema accepts."""

    @given(flat_schemas(), arguments)
    def test_the_quick_check_never_accepts_what_the_validator_refuses(
        self, schema: dict[str, Any], given_arguments: dict[str, Any]
    ) -> None:
        """Whatever the quick check accepts, the validator accepts too."""
        check = fast_check(schema)
        if check is not None and check(given_arguments):
            assert Draft202012Validator(schema).is_valid(given_arguments)

    @given(flat_schemas(), arguments)
    def test_a_tool_agrees_with_the_validator(
        self, schema: dict[str, Any], given_arguments: dict[str, Any]
    ) -> None:
        """check_arguments raises ToolArgumentError exactly when the validator refuses."""
        built = build_tool(MCPServerStdio("python", name="s"), remote("t", schema), 1)
        assert isinstance(built, MCPTool)
        valid = Draft202012Validator(schema).is_valid(given_arguments)
        if valid:
            built.check_arguments(freeze(given_arguments))
        else:
            with pytest.raises(ToolArgumentError) as refused:
                built.check_arguments(freeze(given_arguments))
            assert refused.value.problems and refused.value.tool == "t"


blocks = st.one_of(
    st.builds(lambda t: mt.TextContent(text=t), st.text(max_size=8)),
    st.builds(
        lambda m, d: mt.ImageContent(data=d, mime_type=m),
        st.sampled_from(["image/png", "image/svg+xml", "image/jpeg", "text/plain"]),
        st.sampled_from([base64.b64encode(png(2, 2)).decode(), "bm90IGFuIGltYWdl", "!!"]),
    ),
    st.builds(lambda d: mt.AudioContent(data=d, mime_type="audio/wav"), st.just("AAAA")),
    st.builds(
        lambda u, t: mt.EmbeddedResource(resource=mt.TextResourceContents(uri=u, text=t)),
        st.sampled_from(["note://a", "file:///x.txt"]),
        st.text(max_size=8),
    ),
    st.builds(lambda u: mt.ResourceLink(uri=u, name="r"), st.just("file:///y")),
)


class TestContent:
    """Any content a server sends becomes valid parts, text staying text."""

    @given(st.lists(blocks, max_size=6))
    def test_every_block_becomes_a_part(self, given_blocks: list[Any]) -> None:
        """No block raises; each non-empty block gives one part; base64 is never copied
        into text."""
        parts = content_to_parts(given_blocks)
        assert all(isinstance(p, PART_TYPES) for p in parts)
        non_empty = [b for b in given_blocks if not (isinstance(b, mt.TextContent) and not b.text)]
        assert len(parts) == len(non_empty)
        assert not any(isinstance(p, TextPart) and "iVBOR" in p.text for p in parts)

    @given(st.lists(st.text(min_size=1, max_size=8), max_size=5))
    def test_text_only_content_is_one_string(self, texts: list[str]) -> None:
        """Text blocks alone make one str, joined by newlines (the fast path)."""
        parts = content_to_parts([mt.TextContent(text=t) for t in texts])
        assert parts_or_text(parts) == "\n".join(texts)


class TestRegistry:
    """A run's registry holds exactly the servers' current tools, never overriding one."""

    @given(st.lists(st.lists(st.sampled_from(["a", "b", "c", "x"]), unique=True), max_size=6))
    def test_each_listing_replaces_the_last(self, listings: list[list[str]]) -> None:
        """After each sync the run's MCP tools are the server's latest listing, the agent's
        own tool is untouched, and a listing that would take its name changes nothing."""

        @tool
        def x() -> str:
            """The agent's own tool."""
            return "x"

        server = MCPServerStdio("python", name="s")
        layer = MCPTools(server)
        ctx = RunContext.new(tools=[x])
        before = ("x",)
        for listing in listings:
            server._adopt([remote(n) for n in listing])
            if "x" in listing:
                with pytest.raises(MCPToolConflict, match="'x'"):
                    layer.sync(ctx)
                assert ctx.tools.names == before
                continue
            layer.sync(ctx)
            assert ctx.tools.get("x") is x
            assert sorted(ctx.tools.names) == sorted(["x", *listing])
            before = ctx.tools.names
