"""tinyctx.formats converts histories losslessly and rejects what a format cannot hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    AssistantMessage,
    Message,
    SystemMessage,
    TinyCtxError,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.formats import (
    EXTENSION_KEY,
    FormatError,
    Transcript,
    detect_format,
    format_transcript,
    from_anthropic,
    from_claude_code,
    from_mini_swe_agent,
    from_openai,
    from_swe_agent,
    load_transcript,
    parse_transcript,
    read_transcript,
    to_anthropic,
    to_mini_swe_agent,
    to_openai,
    to_swe_agent,
    write_transcript,
)
from tinyctx.messages import check_pairing
from tinyctx.parts import ImagePart, media_parts
from tinyctx.testing import assert_pairing_intact
from tinyctx.testing.strategies import histories

CALL = ToolCall("call_1", "search", {"q": "tinyctx", "n": [1, 2]})
HISTORY: tuple[Message, ...] = (
    SystemMessage("Be brief."),
    UserMessage("What is tinyctx?"),
    AssistantMessage("Searching.", (CALL,)),
    ToolResult("call_1", "a context library", "search"),
    AssistantMessage("A context library."),
)
WRITABLE = ("openai", "anthropic", "swe_agent", "mini_swe_agent")
CONVERTERS = {
    "openai": (to_openai, from_openai),
    "anthropic": (to_anthropic, from_anthropic),
    "swe_agent": (to_swe_agent, from_swe_agent),
    "mini_swe_agent": (to_mini_swe_agent, from_mini_swe_agent),
}


_METADATA = [
    {"source": "retrieval", "score": 3, "tags": ["a", "b"]},
    {"k": [1, {"x": None, "ü": "日本語"}]},
    # values under the formats' own namespaces and the kernel's key must survive as data
    {"openai": {"role": "robot", "content": 7}},
    {"anthropic": 5},
    {"swe_agent": {}},
    {"openai": {"reasoning_content": "kept"}},
    {"tinyctx": {"synthetic": "cancelled"}},
]
_DECORATIONS = st.sampled_from(
    ["metadata", "not-essential", "result-name", "error", "bad-arguments"]
)


@st.composite
def rich_histories(draw: st.DrawFn) -> tuple[Message, ...]:
    """Generated histories plus what the formats must carry: metadata (some of it under the
    formats' own keys), essential flags, result names that differ from the call's, error
    results, unparsable arguments. A few decorations per history keep generation cheap."""
    out = list(draw(histories()))
    if not out:
        return ()
    picks = draw(st.lists(st.tuples(st.integers(0, len(out) - 1), _DECORATIONS), max_size=5))
    for index, kind in picks:
        message = out[index]
        if kind == "metadata":
            message = attrs.evolve(message, metadata=draw(st.sampled_from(_METADATA)))
        elif kind == "not-essential":
            message = attrs.evolve(message, essential=False)
        elif kind == "result-name" and isinstance(message, ToolResult):
            message = attrs.evolve(message, name=draw(st.sampled_from(["", "renamed"])))
        elif kind == "error" and isinstance(message, ToolResult):
            message = attrs.evolve(message, is_error=not message.is_error)
        elif (
            kind == "bad-arguments" and isinstance(message, AssistantMessage) and message.tool_calls
        ):
            bad = draw(st.sampled_from(['{"q": ', "[1, 2]", "not json", "42"]))
            first = attrs.evolve(message.tool_calls[0], arguments={}, invalid_arguments=bad)
            message = attrs.evolve(message, tool_calls=(first, *message.tool_calls[1:]))
        out[index] = message
    return tuple(out)


def _unit_keys(units: list[dict[str, Any]]) -> set[str]:
    """Keys of messages and of their content blocks (not of tool arguments)."""
    keys: set[str] = set()
    for unit in units:
        keys |= set(unit)
        if isinstance(unit.get("content"), list):
            keys |= {k for block in unit["content"] for k in block}
    return keys


class TestRoundTrips:
    """from_x(to_x(m)) == m for every history a format can express, metadata included."""

    @given(rich_histories())
    def test_every_format_and_its_file_text_round_trip(self, history: tuple[Message, ...]) -> None:
        for fmt, (to_x, from_x) in CONVERTERS.items():
            assert from_x(to_x(history)) == history, fmt
            text = format_transcript(history, fmt)  # type: ignore[arg-type]
            assert parse_transcript(text, format=fmt).messages == history, fmt  # type: ignore[arg-type]
            # detection may read a plain history as another format; it means the same
            assert parse_transcript(text).messages == history, fmt

    @given(rich_histories())
    def test_api_mode_sends_what_the_apis_accept(self, history: tuple[Message, ...]) -> None:
        openai_sent = to_openai(history, for_api=True)
        anthropic_sent = to_anthropic(history, for_api=True)
        anthropic_units = anthropic_sent["messages"] + anthropic_sent.get("system", [])
        assert EXTENSION_KEY not in _unit_keys(openai_sent) | _unit_keys(anthropic_units)
        tool_messages = [m for m in openai_sent if m["role"] == "tool"]
        assert all(set(m) == {"role", "tool_call_id", "content"} for m in tool_messages)
        # OpenAI tool messages take text only: their media follow in a user message
        assert all(isinstance(m["content"], str) for m in tool_messages)
        sent_media = [
            p["type"]
            for m in openai_sent
            if isinstance(m["content"], list)
            for p in m["content"]
            if p["type"] != "text"
        ]
        expected = [
            "image_url" if isinstance(p, ImagePart) else "file"
            for m in history
            if isinstance(m, (UserMessage, ToolResult))
            for p in media_parts(m.content)
        ]
        assert sorted(sent_media) == sorted(expected)
        sent = anthropic_sent["messages"]
        for index, message in enumerate(sent):
            calls = [b["id"] for b in message["content"] if b["type"] == "tool_use"]
            if message["role"] != "assistant" or not calls:
                continue
            # the API wants every call answered first thing in the next user turn
            heads = [b["tool_use_id"] for b in sent[index + 1]["content"][: len(calls)]]
            assert sorted(heads) == sorted(calls)
            assert all(
                isinstance(b["input"], dict) for b in message["content"] if b["type"] == "tool_use"
            )


class TestOpenAI:
    """OpenAI messages: tool_calls with JSON-string arguments, the tool role, kept extras."""

    def test_the_shape_of_each_message(self) -> None:
        assert to_openai(HISTORY) == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is tinyctx?"},
            {
                "role": "assistant",
                "content": "Searching.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "search",
                            "arguments": '{"q": "tinyctx", "n": [1, 2]}',
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": "a context library",
                "name": "search",
            },
            {"role": "assistant", "content": "A context library."},
        ]
        assert to_openai(HISTORY, for_api=True)[3] == {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": "a context library",
        }

    def test_what_openai_has_no_field_for_rides_in_the_tinyctx_key(self) -> None:
        result = ToolResult("call_1", "boom", "search", True, essential=False, metadata={"k": [1]})
        (_, unit) = to_openai([AssistantMessage("", (CALL,)), result])
        assert unit[EXTENSION_KEY] == {"essential": False, "metadata": {"k": [1]}, "is_error": True}
        assert (
            EXTENSION_KEY not in to_openai([AssistantMessage("", (CALL,)), result], for_api=True)[1]
        )

    def test_fields_tinyctx_does_not_model_are_kept_and_written_back(self) -> None:
        raw = [
            {"role": "developer", "content": "rules"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "think",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "c",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"a":1}'},
                    }
                ],
                "extra": {"cost": 0.1},
            },
            {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "ok"}]},
        ]
        messages = from_openai(raw)
        assert messages[0] == SystemMessage("rules", metadata={"openai": {"role": "developer"}})
        assert messages[1].metadata["openai"]["reasoning_content"] == "think"
        assert messages[1].tool_calls == (ToolCall("c", "f", {"a": 1}),)
        assert messages[2] == ToolResult(
            "c", "ok", "f", metadata={"openai": {"content": ({"type": "text", "text": "ok"},)}}
        )
        written = to_openai(messages)
        assert [{k: v for k, v in u.items() if k != "name"} for u in written] == raw
        api = to_openai(messages, for_api=True)
        assert api[0] == {"role": "developer", "content": "rules"}
        assert "reasoning_content" not in api[1] and "extra" not in api[1]

    def test_a_kept_spelling_goes_stale_when_a_layer_edits_the_message(self) -> None:
        raw = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "c",
                "content": [{"type": "text", "text": "long output"}],
            },
        ]
        call, result = from_openai(raw)
        cleared = attrs.evolve(result, content="[cleared]")
        unit = to_openai([call, cleared])[1]
        assert unit["content"] == "[cleared]"
        assert from_openai(to_openai([call, cleared])) == (call, cleared)

    def test_arguments_that_are_not_json_are_kept_verbatim(self) -> None:
        raw = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"a": '},
                    }
                ],
            }
        ]
        (message,) = from_openai(raw)
        assert message.tool_calls[0].invalid_arguments == '{"a": '
        assert message.tool_calls[0].arguments == {}
        assert to_openai([message]) == raw

    @pytest.mark.parametrize(
        ("call", "match"),
        [
            (
                ToolCall("c", "f", {"a": 1}, invalid_arguments="x"),
                "both arguments and invalid_arguments",
            ),
            (ToolCall("c", "f", invalid_arguments='{"a": 1}'), "would read back as arguments"),
        ],
    )
    def test_a_call_that_cannot_round_trip_is_an_error_naming_the_index(
        self, call: ToolCall, match: str
    ) -> None:
        with pytest.raises(FormatError, match=f"openai message 1: .*{match}") as caught:
            to_openai([UserMessage("q"), AssistantMessage("", (call,))])
        assert caught.value.index == 1

    @pytest.mark.parametrize(
        ("raw", "index", "match"),
        [
            (
                [{"role": "robot", "content": "x"}],
                0,
                r"unknown role 'robot' \(allowed: system, developer",
            ),
            (
                [
                    {"role": "user", "content": "x"},
                    {"role": "tool", "tool_call_id": "c", "content": "r"},
                ],
                1,
                "tool result without a call",
            ),
            ([{"role": "tool", "content": "r"}], 0, "tool_call_id must be a non-empty string"),
            (
                [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
                0,
                "cannot express a 'input_audio' content part",
            ),
            ([{"role": "assistant", "tool_calls": {"id": "c"}}], 0, "tool_calls must be a list"),
            (
                [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "type": "custom", "custom": {}}],
                    }
                ],
                0,
                "cannot express a 'custom' tool call",
            ),
            (["not a message"], 0, "a message must be a JSON object"),
            (
                [{"role": "user", "content": "x", EXTENSION_KEY: {"colour": 1}}],
                0,
                "unknown key 'colour'",
            ),
            (
                [
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
                    },
                    {"role": "assistant", "content": "next"},
                ],
                0,
                "orphan tool call 'c'",
            ),
        ],
        ids=[
            "role",
            "result-without-call",
            "no-id",
            "image",
            "calls-not-list",
            "custom-call",
            "not-object",
            "extension",
            "orphan-call",
        ],
    )
    def test_malformed_input_is_an_error_naming_the_index(
        self, raw: list[Any], index: int, match: str
    ) -> None:
        with pytest.raises(FormatError, match=match) as caught:
            from_openai(raw)
        assert caught.value.index == index
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, TinyCtxError)
        assert f"message {index}:" in str(caught.value)

    def test_reused_call_ids_are_renamed_and_restored_when_written(self) -> None:
        def turn(text: str) -> list[dict[str, Any]]:
            return [
                {
                    "role": "assistant",
                    "content": text,
                    "tool_calls": [
                        {
                            "id": "call_0",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_0", "content": text, "name": "f"},
            ]

        raw = [*turn("one"), *turn("two"), *turn("three")]
        messages = from_openai(raw)
        check_pairing(messages, allow_pending=False)
        assert [m.tool_calls[0].id for m in messages if isinstance(m, AssistantMessage)] == [
            "call_0",
            "call_0_r2",
            "call_0_r3",
        ]
        assert [m.tool_call_id for m in messages if isinstance(m, ToolResult)] == [
            "call_0",
            "call_0_r2",
            "call_0_r3",
        ]
        assert to_openai(messages) == raw
        # the API gets the unique ids
        assert to_openai(messages, for_api=True)[2]["tool_calls"][0]["id"] == "call_0_r2"
        # an edited history whose ids no longer clash keeps the unique ids
        edited = messages[2:]
        assert from_openai(to_openai(edited)) == edited


class TestAnthropic:
    """Anthropic messages: system apart, tool_use / tool_result blocks, kept assistant blocks."""

    def test_the_shape_of_the_request(self) -> None:
        results = (
            AssistantMessage("", (CALL, ToolCall("call_2", "fetch"))),
            ToolResult("call_1", "found", "search"),
            ToolResult("call_2", "timeout", "fetch", is_error=True),
            UserMessage("thanks"),
        )
        assert to_anthropic(HISTORY[:2] + results) == {
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "What is tinyctx?"},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "call_1",
                            "name": "search",
                            "input": {"q": "tinyctx", "n": [1, 2]},
                        },
                        {"type": "tool_use", "id": "call_2", "name": "fetch", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "found"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "call_2",
                            "content": "timeout",
                            "is_error": True,
                        },
                    ],
                },
                {"role": "user", "content": "thanks"},
            ],
        }
        sent = to_anthropic(HISTORY[:2] + results, for_api=True)
        assert sent["system"] == [{"type": "text", "text": "Be brief."}]
        assert sent["messages"][-1]["content"][-1] == {"type": "text", "text": "thanks"}
        assert len(sent["messages"]) == 3

    def test_an_empty_assistant_turn_is_not_sent_to_the_api(self) -> None:
        history = (UserMessage("a"), AssistantMessage(""), UserMessage("b"))
        assert to_anthropic(history, for_api=True)["messages"] == [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
        assert from_anthropic(to_anthropic(history)) == history

    def test_a_system_message_after_the_start_cannot_be_expressed(self) -> None:
        with pytest.raises(
            FormatError, match="anthropic message 2: cannot express a system message"
        ):
            to_anthropic([UserMessage("a"), AssistantMessage("b"), SystemMessage("late")])

    def test_thinking_and_server_tool_blocks_are_kept_while_the_message_is_unchanged(self) -> None:
        blocks = [
            {"type": "thinking", "thinking": "hmm", "signature": "s1"},
            {"type": "text", "text": "Checking.", "citations": None},
            {
                "type": "server_tool_use",
                "id": "srv_1",
                "name": "web_search",
                "input": {"query": "x"},
            },
            {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []},
            {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
        ]
        (message,) = from_anthropic([{"role": "assistant", "content": blocks}])
        assert message.content == "Checking."
        assert message.tool_calls == (ToolCall("toolu_1", "read", {"path": "a"}),)
        no_nulls = [{k: v for k, v in b.items() if v is not None} for b in blocks]
        assert to_anthropic([message], for_api=True)["messages"][0]["content"] == no_nulls
        edited = attrs.evolve(message, content="Edited.")
        assert to_anthropic([edited], for_api=True)["messages"][0]["content"] == [
            {"type": "text", "text": "Edited."},
            {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
        ]

    def test_text_and_result_blocks_of_one_user_message_keep_their_order(self) -> None:
        raw = [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [{"type": "text", "text": "r"}],
                    },
                    {"type": "text", "text": "and also"},
                ],
            },
        ]
        _, result, user = from_anthropic(raw)
        assert (result.text, result.name, user) == (
            "r",
            "f",
            UserMessage(
                "and also",
                metadata={"anthropic": {"content": ({"type": "text", "text": "and also"},)}},
            ),
        )

    @pytest.mark.parametrize(
        ("raw", "index", "match"),
        [
            (
                [{"role": "system", "content": "x"}],
                0,
                "unknown role 'system'.*separate system field",
            ),
            (
                [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}],
                    }
                ],
                0,
                "tool result without a call",
            ),
            (
                [
                    {"role": "user", "content": "a"},
                    {"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]},
                ],
                1,
                "cannot hold an image source of type 'file'",
            ),
            (
                [{"role": "assistant", "content": 7}],
                0,
                "assistant content must be a string or a list",
            ),
        ],
        ids=["system-role", "result-without-call", "image", "content-type"],
    )
    def test_malformed_input_is_an_error_naming_the_index(
        self, raw: list[Any], index: int, match: str
    ) -> None:
        with pytest.raises(FormatError, match=match) as caught:
            from_anthropic(raw)
        assert caught.value.index == index


class TestSweAgent:
    """SWE-agent histories (tool_calls maybe a Python repr) and mini-swe-agent trajectories."""

    def test_tool_calls_stored_as_a_python_repr_are_read(self) -> None:
        calls = [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"cmd": "ls"}'},
            }
        ]
        history = [
            {"role": "system", "content": "sys", "message_type": "system_prompt", "agent": "main"},
            {
                "role": "assistant",
                "content": "look",
                "thought": "look",
                "action": "ls",
                "agent": "main",
                "message_type": "action",
                "tool_calls": repr(calls),
            },
            {
                "role": "tool",
                "content": "a b",
                "agent": "main",
                "message_type": "observation",
                "tool_call_ids": ["call_a"],
            },
        ]
        messages = from_swe_agent({"history": history, "info": {}})
        assert messages[1].tool_calls == (ToolCall("call_a", "bash", {"cmd": "ls"}),)
        assert messages[2] == ToolResult("call_a", "a b", "bash")
        assert to_swe_agent(messages)["history"] == history

    def test_an_observation_for_several_calls_cannot_be_expressed(self) -> None:
        history = [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "a", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "function": {"name": "f", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "content": "both", "tool_call_ids": ["a", "b"]},
        ]
        with pytest.raises(FormatError, match="swe_agent message 1: .*exactly one call.*names 2"):
            from_swe_agent(history)

    def test_the_mini_swe_agent_exit_record_is_kept_apart_from_the_messages(self) -> None:
        data = {
            "trajectory_format": "mini-swe-agent-1.1",
            "info": {"exit_status": "Submitted"},
            "messages": [
                {"role": "user", "content": "fix it", "extra": {"t": 1}},
                {"role": "exit", "content": "patch", "extra": {"exit_status": "Submitted"}},
            ],
        }
        transcript = parse_transcript(json.dumps(data))
        assert transcript.format == "mini_swe_agent"
        assert transcript.messages == (
            UserMessage("fix it", metadata={"openai": {"extra": {"t": 1}}}),
        )
        assert transcript.info["exit"][0]["content"] == "patch"
        assert transcript.info["info"] == {"exit_status": "Submitted"}


class TestClaudeCode:
    """Claude Code session logs: one entry per block, merged back into API messages."""

    def test_blocks_of_one_response_are_merged_around_their_results(self) -> None:
        def assistant(block: dict[str, Any]) -> dict[str, Any]:
            return {
                "type": "assistant",
                "isSidechain": False,
                "message": {
                    "id": "msg_1",
                    "role": "assistant",
                    "model": "m",
                    "content": [block],
                    "stop_reason": None,
                },
            }

        def result(call_id: str) -> dict[str, Any]:
            return {
                "type": "user",
                "isSidechain": False,
                "message": {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": call_id,
                            "content": "ok",
                            "is_error": False,
                        }
                    ],
                },
            }

        entries = [
            {"type": "progress", "data": {}},
            {"type": "user", "isSidechain": False, "message": {"role": "user", "content": "go"}},
            assistant({"type": "text", "text": "Two things."}),
            assistant({"type": "tool_use", "id": "a", "name": "Bash", "input": {}}),
            result("a"),
            assistant({"type": "tool_use", "id": "b", "name": "Read", "input": {}}),
            result("b"),
            {
                "type": "assistant",
                "isSidechain": True,
                "message": {"id": "x", "role": "assistant", "content": []},
            },
        ]
        messages = from_claude_code(entries)
        assert [type(m).__name__ for m in messages] == [
            "UserMessage",
            "AssistantMessage",
            "ToolResult",
            "ToolResult",
        ]
        assert [c.id for c in messages[1].tool_calls] == ["a", "b"]
        assert messages[1].content == "Two things."
        check_pairing(messages, allow_pending=False)

    def test_an_error_names_the_log_entry(self) -> None:
        entries = [
            {"type": "summary"},
            {
                "type": "user",
                "message": {"role": "user", "content": [{"type": "search_result"}]},
            },
        ]
        with pytest.raises(
            FormatError, match="claude_code message 1: cannot express a 'search_result'"
        ):
            from_claude_code(entries)


class TestFiles:
    """Transcript files: format detection, line-numbered errors, writing back."""

    def test_each_writable_format_is_detected_and_read_back(self, tmp_path: Path) -> None:
        for fmt in WRITABLE:
            path = tmp_path / f"history.{fmt}"
            write_transcript(HISTORY, path, fmt)  # type: ignore[arg-type]
            transcript = read_transcript(path)
            assert (transcript.format, transcript.messages) == (fmt, HISTORY)
            assert transcript.path == str(path)
            assert load_transcript(path, format=fmt) == HISTORY  # type: ignore[arg-type]

    def test_jsonl_errors_name_the_file_and_line(self, tmp_path: Path) -> None:
        path = tmp_path / "t.jsonl"
        path.write_text('{"role": "user", "content": "a"}\n\n{"role": "robot", "content": "b"}\n')
        with pytest.raises(
            FormatError, match=rf"{path}:3: openai message 1: unknown role 'robot'"
        ) as caught:
            load_transcript(path)
        assert (caught.value.line, caught.value.index) == (3, 1)
        path.write_text('{"role": "user", "content": "a"}\n{"role": "user", "content": \n')
        with pytest.raises(FormatError, match=rf"{path}:2: jsonl: bad JSON"):
            load_transcript(path)
        path.write_text('{"messages": [\n  {"role": "user"\n')
        with pytest.raises(FormatError, match=r":3: json: bad JSON"):
            load_transcript(path)

    @pytest.mark.parametrize(
        ("document", "fmt"),
        [
            ([{"role": "user", "content": "x"}], "openai"),
            ({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}, "openai"),
            ({"system": "s", "messages": [{"role": "user", "content": "x"}]}, "anthropic"),
            (
                [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                    }
                ],
                "anthropic",
            ),
            ({"history": []}, "swe_agent"),
            ({"trajectory_format": "mini-swe-agent-1.1", "messages": []}, "mini_swe_agent"),
            ([{"type": "user", "message": {"role": "user", "content": "x"}}], "claude_code"),
        ],
    )
    def test_detection(self, document: Any, fmt: str) -> None:
        assert detect_format(document) == fmt

    def test_an_unknown_format_or_shape_is_rejected(self) -> None:
        with pytest.raises(
            FormatError, match="unknown format 'yaml' \\(allowed: openai, anthropic"
        ):
            parse_transcript("[]", format="yaml")  # type: ignore[arg-type]
        with pytest.raises(FormatError, match="cannot tell the transcript format"):
            parse_transcript('{"rows": []}')
        with pytest.raises(FormatError, match="cannot write 'claude_code'"):
            format_transcript(HISTORY, "claude_code")

    def test_an_empty_file_is_an_empty_history(self) -> None:
        assert parse_transcript("\n") == Transcript((), "openai")


class TestRealTranscripts:
    """The shared real transcripts convert, keep pairing, and write back without loss."""

    def test_every_transcript_converts_and_keeps_pairing(self, shared_data: Path) -> None:
        paths = sorted((shared_data / "transcripts").glob("openai/*.jsonl"))
        paths += sorted((shared_data / "transcripts").glob("raw/*"))
        assert len(paths) >= 10
        seen = set()
        for path in paths:
            transcript = read_transcript(path)
            seen.add(transcript.format)
            assert transcript.messages, path
            check_pairing(transcript.messages)  # a trailing submit call may be pending
            assert_pairing_intact(transcript.messages)
        assert seen == {"openai", "swe_agent", "mini_swe_agent", "claude_code"}

    def test_raw_trajectories_write_back_to_the_same_documents(self, shared_data: Path) -> None:
        raw = shared_data / "transcripts" / "raw"
        for path in sorted(raw.glob("*.traj*")):
            document = json.loads(path.read_text())
            transcript = read_transcript(path)
            if transcript.format == "swe_agent":
                assert to_swe_agent(transcript.messages)["history"] == document["history"]
            else:
                kept = [m for m in document["messages"] if m["role"] != "exit"]
                written = to_mini_swe_agent(transcript.messages)["messages"]
                assert [{k: v for k, v in u.items() if k != "name"} for u in written] == kept

    def test_normalized_transcripts_round_trip_through_every_format(
        self, shared_data: Path
    ) -> None:
        for path in sorted((shared_data / "transcripts" / "openai").glob("*.jsonl")):
            messages = load_transcript(path)
            for to_x, from_x in CONVERTERS.values():
                assert from_x(to_x(messages)) == messages, (path.name, to_x.__name__)
