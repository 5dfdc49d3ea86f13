"""The C reader (tinyctx._speedups): the Python reader's results, faster, or no answer."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import AssistantMessage, Message, ToolCall, UserMessage, codec
from tinyctx.codec import CodecError, decode_messages, encode_message
from tinyctx.codec import encode_messages as encode_all
from tinyctx.documents import SplitDocuments, split_document
from tinyctx.testing.strategies import histories, messages

pytestmark = pytest.mark.skipif(
    not codec.C_READER and os.environ.get("TINYCTX_REQUIRE_EXTENSIONS") != "1",
    reason="tinyctx._speedups was not built here (no C compiler at install)",
)

Row = tuple[str, str | None] | str


def _c(row: Row) -> Message | None:
    read = codec._read_rows
    assert read is not None, "TINYCTX_REQUIRE_EXTENSIONS=1 but tinyctx._speedups is not loaded"
    answer: Message | None = read([row])[0]
    return answer


def _python(row: Row) -> tuple[str, Any]:
    try:
        return ("ok", codec._decode_row(row))
    except CodecError as exc:
        return ("error", str(exc))


def _same(c_answer: Message | None, row: Row) -> None:
    """The C reader's answer is the Python reader's message, field types and all, or None."""
    if c_answer is None:
        return
    outcome, python = _python(row)
    assert outcome == "ok", f"C read a document Python refuses: {row!r} ({python})"
    assert c_answer == python
    assert repr(c_answer) == repr(python)  # shows bool vs int, tuple vs list, nested types


def _rows(doc: str) -> list[Row]:
    return [doc, split_document(doc)]


def _agrees(doc: str) -> None:
    """Whole or split, the C reader answers the Python reader's message, or nothing."""
    for row in _rows(doc):
        _same(_c(row), row)


def _content_first(obj: dict[str, Any]) -> dict[str, Any]:
    """The object with its content first, as the encoder writes it."""
    content = {"content": obj["content"]} if "content" in obj else {}
    return {**content, **obj}


def _python_only(doc: str) -> bool:
    """What the C reader leaves to Python in a good document: a lone surrogate (which
    orjson refuses too)."""
    try:
        orjson.loads(doc)
    except orjson.JSONDecodeError:
        return True
    return False


# one field of a good document changed to a value of any kind, or taken out, or one added
_KEYS = ("v", "role", "content", "tool_call_id", "name", "is_error", "essential", "metadata")
_CALL_KEYS = ("id", "name", "arguments", "invalid_arguments")
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([1.0, 2**63, 1e19, "", "x", "tool", "user", "c1", [], {}, [1], {"a": 1.5}]),
    st.sampled_from([[{"id": "c", "name": "n"}], [{"id": "c", "name": "n"}] * 2]),
)
_OUT = object()  # the field taken out


@st.composite
def _edited(draw: st.DrawFn) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(encode_message(draw(messages())))
    target = obj
    calls = obj.get("tool_calls")
    keys = (*_KEYS, "tool_calls", "extra")
    if calls and draw(st.booleans()):
        target = draw(st.sampled_from(calls))
        keys = (*_CALL_KEYS, "extra")
    value = draw(_VALUES | st.just(_OUT))
    key = draw(st.sampled_from(keys))
    if value is _OUT:
        target.pop(key, None)
    else:
        target[key] = value
    return obj


class TestSameMessagesAsPython:
    """Wherever the C reader answers, it answers exactly what the Python reader decodes."""

    @given(history=histories(pending=True))
    def test_every_generated_history(self, history: tuple[Message, ...]) -> None:
        """Each document, whole or split, reads to the same message; plain texts all in C."""
        for doc, message in zip(encode_all(history), history, strict=True):
            for row in _rows(doc):
                answer = _c(row)
                _same(answer, row)
                plain = type(getattr(message, "content", None)) is str  # parts: strict reader
                if plain and not _python_only(doc):
                    assert answer == message

    @given(obj=_edited(), split=st.booleans(), compact=st.booleans())
    def test_a_document_with_any_field_changed(
        self, obj: dict[str, Any], split: bool, compact: bool
    ) -> None:
        """A document Python refuses gets no answer from C; one it reads, the same message
        (compact as the encoder writes, or spaced, which C leaves to Python)."""
        doc = json.dumps(_content_first(obj), separators=(",", ":") if compact else None)
        row: Row = split_document(doc) if split else doc
        _same(_c(row), row)

    @pytest.mark.parametrize("number", [2**63, -(2**63) - 1, 10**30, 1e19, 1.5, 2**63 - 1])
    def test_numbers_past_64_bits_keep_their_type(self, number: int | float) -> None:
        """A huge integer stays an integer and a float a float, with or without C."""
        message = AssistantMessage("", (ToolCall("c1", "run", {"n": [number]}),))
        (doc,) = encode_all((message,))
        decoded = decode_messages(SplitDocuments([split_document(doc)]))
        assert decoded == (message,)
        assert type(decoded[0].tool_calls[0].arguments["n"][0]) is type(number)

    def test_bytes_and_odd_rows_go_to_python(self) -> None:
        """A row that is not a str or a (head, text) pair is the Python reader's to read."""
        (doc,) = encode_all((AssistantMessage("hi"),))
        assert _c(doc.encode()) is None  # type: ignore[arg-type]
        assert _c(("{}", b"x")) is None  # type: ignore[arg-type]
        assert decode_messages([doc.encode()]) == (AssistantMessage("hi"),)


# any JSON value, floats, huge numbers and every kind of character included
_ANY_JSON: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["\ud800", "a\udfffb", "\U0001f600", "\x00\x1f\x7f", '"\\/'])
    | st.sampled_from([0.1, -0.0, 1e-320, 5e-324, 1.7976931348623157e308, 1e16, 2**53 + 1]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _spellings(obj: dict[str, Any]) -> list[str]:
    """A message object as the encoder spells it (compact, ASCII, the content first), and
    two other ways JSON allows: non-ASCII as it is, and numbers spelled with exponents."""
    ordered = _content_first(obj)
    compact = json.dumps(ordered, separators=(",", ":"))
    return [
        compact,
        json.dumps(ordered, separators=(",", ":"), ensure_ascii=False),
        compact.replace('"n":1}', '"n":1E0}').replace('"n":2', '"n":2e+0'),
    ]


class TestTheDirectReader:
    """Documents of any spelling are parsed by orjson and built in C; what that reader
    answers, the Python reader answers too."""

    @given(value=_ANY_JSON, where=st.sampled_from(["metadata", "arguments"]))
    def test_any_json_value_in_metadata_or_arguments(self, value: Any, where: str) -> None:
        """Floats, huge numbers, escapes, surrogates and nesting: the same message or none."""
        call = {"arguments": {"v": value, "n": 1}, "id": "c1", "name": "run"}
        obj: dict[str, Any] = {"content": "x", "role": "assistant", "tool_calls": [call], "v": 1}
        if where == "metadata":
            obj["metadata"] = {"m": value, "n": 2}
        for doc in _spellings(obj):
            _agrees(doc)

    @pytest.mark.parametrize(
        "text",
        [
            'plain "quoted" \\ back/slash',
            "\b\f\n\r\t and \x00\x01\x1f",
            "caf\u00e9 \u2500\u2500 \U0001f600 \u00ff",
            "x" * 600 + "\n" + "\u00e9" * 300,  # past the reader's stack buffers
        ],
    )
    def test_every_escape(self, text: str) -> None:
        """Every JSON escape and the wide characters read back exactly."""
        message = AssistantMessage(
            text,
            (ToolCall("c1", text[:20] or "t", {text: [text, {text: text}]}),),
            metadata={"note": text},
        )
        (doc,) = encode_all((message,))
        for row in _rows(doc):
            assert _c(row) == message

    @pytest.mark.parametrize(
        "spelled",
        [
            "0",
            "-0",
            "7",
            "-12",
            "123456789012345678",
            "1234567890123456789",
            "1.5",
            "-0.0",
            "1e5",
            "1E+5",
            "2.5e-3",
            "1e400",
            "-1e400",
            "4.9e-324",
            "0.1000000000000000055511",
            "9" * 40,
            "9" * 41,  # past the reader's number buffer: the Python reader's
            "1" * 50,
            "-" + "1" * 60,
            "0." + "5" * 70,
            "1e" + "0" * 45,
            "01",
            "1.",
            ".5",
            "+1",
            "1e",
            "--1",
            "NaN",
            "Infinity",
            "0x10",
            "1_000",
            '"\\ud800"',
            '"\\udc00x"',
            '"\\ud800\\u0041"',
            '"\\u12"',
            '"\\q"',
            '"a\tb"',
            "tru",
            "nul",
            "[1,]",
            "[,1]",
            '{"a":1,}',
            '{"a":1,"a":2}',
            '{"\\u0061":1}',
        ],
    )
    def test_odd_json_in_arguments(self, spelled: str) -> None:
        """Numbers of every spelling, bad escapes, raw control characters, trailing commas,
        repeated keys: C answers what Python reads, or leaves the document to it."""
        doc = (
            '{"content":"x","role":"assistant","tool_calls":[{"arguments":{"a":'
            + spelled
            + '},"id":"c1","name":"run"}],"v":1}'
        )
        _agrees(doc)

    @pytest.mark.parametrize(
        "doc",
        [
            '{"content":"x","role":"user","v":1,"v":1}',
            '{"content":"x","role":"user","\\u0076":1}',
            '{"content":"x", "role":"user","v":1}',
            '{"content":"x","role":"user","v":1} ',
            '{"content":"x","role":"user","v":1}{}',
            '{"content":"x","role":"user","v":01}',
            '{"content":"x","role":"user","v":1.0}',
            '{"content":"x","role":"user","essential":1,"v":1}',
            '{"content":"x","metadata":{},"role":"user","v":1}',
            '{"content":"x","metadata":{"a":{}},"role":"user","v":1}',
            '{"content":"x","metadata":null,"role":"user","v":1}',
            '{"content":null,"role":"user","v":1}',
            '{"content":"x","role":"assistant","tool_calls":[],"v":1}',
            '{"content":"x","role":"assistant","tool_calls":null,"v":1}',
            '{"content":"x","role":"assistant","tool_calls":[{"id":"a","name":"t","id":"b"}],'
            '"v":1}',
            '{"content":"x","role":"tool","tool_call_id":"c","is_error":true,"name":"","v":1}',
        ],
    )
    def test_odd_documents(self, doc: str) -> None:
        """Repeated or escaped keys, spaces, trailing text, odd values: the same message as
        Python reads, or none."""
        _agrees(doc)

    def test_a_document_in_another_spelling_is_read_in_c(self) -> None:
        """Spaces and non-ASCII text as it is: orjson parses it, C builds the message."""
        assert _c('{ "content" : "caf\u00e9 ─", "role":"user","v":1}') == UserMessage("café ─")

    def test_a_document_orjson_refuses_is_left_to_python(self) -> None:
        """NaN is no JSON: no C answer, and the Python reader names the problem."""
        doc = '{"content":"x","metadata":{"a":NaN},"role":"user","v":1}'
        assert _c(doc) is None
        _agrees(doc)


def _nested_doc(where: str, levels: int) -> str:
    """A message document whose metadata or call arguments nest ``levels`` objects deep
    (written out as text: the encoder refuses to write it)."""
    value = '{"k":' * levels + '"leaf"' + "}" * levels
    if where == "metadata":
        return '{"content":"hi","metadata":' + value + ',"role":"user","v":1}'
    calls = '[{"arguments":' + value + ',"id":"c1","name":"run"}]'
    return '{"role":"assistant","tool_calls":' + calls + ',"v":1}'


class TestTheNestingLimit:
    """The C reader holds the codec's one nesting limit: to it, the Python reader's message;
    past it, no answer, and the Python reader's CodecError."""

    @pytest.mark.parametrize("where", ["metadata", "arguments"])
    def test_nesting_to_the_limit_is_read_in_c(self, where: str) -> None:
        """A value nested exactly MAX_NESTING levels is read in C, as Python reads it."""
        doc = _nested_doc(where, codec.MAX_NESTING)
        answer = _c(doc)
        assert answer is not None
        _same(answer, doc)

    @pytest.mark.parametrize("where", ["metadata", "arguments"])
    @pytest.mark.parametrize("levels", [codec.MAX_NESTING + 1, 200, 350, 490, 5000])
    def test_nesting_past_the_limit_is_a_codec_error(self, where: str, levels: int) -> None:
        """Deeper gets no C answer, and decoding it is a CodecError, never RecursionError."""
        doc = _nested_doc(where, levels)
        assert _c(doc) is None
        with pytest.raises(CodecError, match="nested") as raised:
            decode_messages([doc])
        assert raised.value.path.startswith("messages[0]")

    def test_the_limit_is_given_by_configure(self) -> None:
        """configure() refuses a max_depth outside 1..1000 (what the C stack holds)."""
        from tinyctx import _speedups

        with pytest.raises(ValueError, match="max_depth"):
            _speedups.configure(
                empty={},
                frozen_dict=(AssistantMessage, ()),
                tool_call=(AssistantMessage, ()),
                tool_result=(AssistantMessage, ()),
                assistant=(AssistantMessage, ()),
                user=(AssistantMessage, ()),
                system=(AssistantMessage, ()),
                tool_keys=frozenset(),
                assistant_keys=frozenset(),
                text_keys=frozenset(),
                call_keys=frozenset(),
                version=1,
                text_hole='{"content":null',
                max_depth=0,
                loads=orjson.loads,
            )
        (doc,) = encode_all((AssistantMessage("still read"),))
        assert _c(doc) == AssistantMessage("still read")


class TestOutOfTheCollectorsSight:
    """Messages built in C are not tracked by the cyclic collector, which would otherwise
    traverse a long thread's thousands of them at every collection while they live."""

    def test_messages_calls_and_mappings_are_untracked(self) -> None:
        """Immutable and built from JSON, they can be in no cycle; refcounting frees them."""
        message = AssistantMessage(
            "x", (ToolCall("c1", "run", {"a": {"b": [1]}}),), metadata={"m": {"n": 1}}
        )
        (doc,) = encode_all((message,))
        for row in _rows(doc):
            built = _c(row)
            assert built == message and built is not None
            call = built.tool_calls[0]
            nested = (built.metadata, built.metadata["m"], call.arguments, call.arguments["a"])
            assert not any(gc.is_tracked(o) for o in (built, built.tool_calls, call, *nested))


class TestErrorsUnchanged:
    """With or without C, a bad document fails the same way, naming the same path."""

    @pytest.mark.parametrize(
        "doc",
        [
            '{"content":"x","role":"user","v":2}',
            '{"content":"x","role":"tool","tool_call_id":5,"v":1}',
            '{"content":"x","role":"assistant","tool_calls":[{"id":"a","name":"t"},'
            '{"id":"a","name":"t"}],"v":1}',
            '{"content":"x","role":"assistant","tool_calls":[{"id":"a","name":"t",'
            '"arguments":[1]}],"v":1}',
            '{"content":"x","metadata":"m","role":"user","v":1}',
            '{"content":"x",}',
        ],
    )
    def test_the_same_error_either_way(self, doc: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """decode_messages raises one CodecError text with the C reader and without it."""
        (good,) = encode_all((AssistantMessage("fine"),))
        for docs in ([good, doc], SplitDocuments([split_document(good), split_document(doc)])):
            with pytest.raises(CodecError, match=r"messages\[1\]") as with_c:
                decode_messages(docs)
            monkeypatch.setattr(codec, "_read_rows", None)
            with pytest.raises(CodecError, match=r"messages\[1\]") as without:
                decode_messages(docs)
            monkeypatch.undo()
            assert str(with_c.value) == str(without.value)


class TestBuilt:
    """The package carries the C reader where it could be compiled, and can run without it."""

    def test_loaded(self) -> None:
        """decode_messages uses it (CI requires it: TINYCTX_REQUIRE_EXTENSIONS=1)."""
        assert codec.C_READER

    def test_turned_off_by_the_environment(self) -> None:
        """TINYCTX_NO_EXTENSIONS=1: the Python reader alone, with the same messages."""
        script = (
            "from tinyctx import codec, UserMessage\n"
            "from tinyctx.codec import encode_messages, decode_messages\n"
            "docs = encode_messages([UserMessage('hi')])\n"
            "assert decode_messages(docs) == (UserMessage('hi'),)\n"
            "print(codec.C_READER)\n"
        )
        env = {**os.environ, "TINYCTX_NO_EXTENSIONS": "1"}
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "False"

    def test_a_class_without_the_slots_is_refused(self) -> None:
        """configure() checks every descriptor is a writable slot of its class, first."""
        from tinyctx import _speedups

        class NoSlots:
            content = property(lambda self: "")

        with pytest.raises(TypeError, match="slot"):
            _speedups.configure(
                empty={},
                frozen_dict=(NoSlots, (NoSlots.__dict__["content"],) * 3),
                tool_call=(NoSlots, ()),
                tool_result=(NoSlots, ()),
                assistant=(NoSlots, ()),
                user=(NoSlots, ()),
                system=(NoSlots, ()),
                tool_keys=frozenset(),
                assistant_keys=frozenset(),
                text_keys=frozenset(),
                call_keys=frozenset(),
                version=1,
                text_hole='{"content":null',
                max_depth=100,
                loads=orjson.loads,
            )
        (doc,) = encode_all((AssistantMessage("still read"),))
        assert _c(doc) == AssistantMessage("still read")  # the refused call changed nothing
