"""The codec: versioned, canonical JSON documents for messages, checkpoints and layer state."""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Callable
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinyctx
from tinyctx import (
    AssistantMessage,
    Message,
    RunConfig,
    SystemMessage,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.agent import Checkpoint
from tinyctx.codec import (
    CODEC_VERSION,
    CodecError,
    decode,
    decode_checkpoint,
    decode_message,
    decode_messages,
    decode_state,
    encode,
    encode_checkpoint,
    encode_message,
    encode_messages,
    encode_state,
)
from tinyctx.documents import TEXT_HOLE, SplitDocuments, join_document, split_document
from tinyctx.frozen import FrozenDict, freeze, thaw
from tinyctx.parts import DocumentPart, ImagePart, Part, TextPart
from tinyctx.testing.images import image_part, pdf_part
from tinyctx.testing.strategies import (
    checkpoints,
    histories,
    json_values,
    layer_states,
    messages,
    run_configs,
    texts,
    tool_calls,
    usages,
)

# metadata as the built-in layers write it: marks in the "tinyctx" namespace, floats, nesting
_MARKS = st.sampled_from(
    [
        {"tinyctx": {"cleared": {"by": "microcompact", "original_bytes": 1234}}},
        {"tinyctx": {"summary": {"messages": 12, "summarizer": "ModelSummarizer"}}},
        {"tinyctx": {"synthetic": "cancelled"}, "trace": "abc"},
        {"openai": {"content": ""}, "score": 0.25, "weights": [1.5, -0.0, 1e300]},
        {"日本語": "テキスト", "emoji": "🙂", "lone": "\ud800"},
    ]
)


@st.composite
def _rich_messages(draw: st.DrawFn) -> Message:
    message = draw(messages())
    if draw(st.booleans()):
        message = message.evolve(metadata=draw(_MARKS))
    if isinstance(message, AssistantMessage) and message.tool_calls and draw(st.booleans()):
        first = message.tool_calls[0]
        broken = ToolCall(first.id, first.name, invalid_arguments=draw(texts(20)))
        message = message.evolve(tool_calls=(broken, *message.tool_calls[1:]))
    return message


def _reordered(value: Any) -> Any:
    """The same JSON value built with every mapping's keys in reverse insertion order."""
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, (list, tuple)):
        return [_reordered(v) for v in value]
    return value


def _walk(value: Any, path: str = "") -> list[tuple[str, Any]]:
    out = [(path, value)]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _walk(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _walk(item, f"{path}[{index}]")
    return out


_PARTS: st.SearchStrategy[Part] = st.one_of(
    texts(30).filter(bool).map(TextPart),
    st.builds(
        image_part,
        st.integers(1, 40),
        st.integers(1, 40),
        st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp"]),
        label=st.sampled_from(["", "screenshot"]),
    ),
    st.builds(pdf_part, st.integers(1, 3), title=st.sampled_from(["doc.pdf", "a b.pdf"])),
    st.builds(
        lambda w, detail: ImagePart(
            url="https://example.com/x.png", width=w, height=w, detail=detail
        ),
        st.integers(1, 4000),
        st.sampled_from([None, "low", "high", "auto"]),
    ),
    st.builds(
        lambda pages: DocumentPart(url="https://example.com/a.pdf", pages=pages),
        st.none() | st.integers(1, 9),
    ),
)


class TestRoundTrip:
    """decode(encode(x)) == x for every value type, and re-encoding gives the same bytes."""

    @given(message=_rich_messages())
    def test_any_message_round_trips(self, message: Message) -> None:
        """A message with any text, metadata, essential flag and tool calls comes back equal."""
        doc = encode_message(message)
        back = decode_message(doc)
        assert back == message
        assert type(back) is type(message)
        assert back.metadata == message.metadata
        assert encode_message(back) == doc

    @given(history=histories(pending=True))
    def test_a_history_round_trips_document_per_message(self, history: tuple[Message, ...]) -> None:
        """Each message is its own document; the list decodes to the same history."""
        docs = encode_messages(history)
        assert len(docs) == len(history)
        assert decode_messages(docs) == history
        assert all(json.loads(doc)["v"] == CODEC_VERSION for doc in docs)

    @given(parts=st.lists(_PARTS, min_size=1, max_size=4), is_result=st.booleans())
    def test_content_parts_round_trip(self, parts: list[Part], is_result: bool) -> None:
        """Text, images and documents (base64 or URL) in user and tool content come back."""
        message: Message = (
            ToolResult("c1", tuple(parts), "screenshot") if is_result else UserMessage(parts)
        )
        doc = encode_message(message)
        assert decode_message(doc) == message
        assert decode_message(doc).parts == message.parts
        assert encode_message(decode_message(doc)) == doc

    def test_a_bad_part_is_named(self) -> None:
        """A part that does not validate names its index and field under content."""
        doc = json.loads(encode_message(UserMessage((TextPart("a"), image_part(4, 4)))))
        doc["content"][1]["data"] = "not base64!"
        with pytest.raises(CodecError) as info:
            decode_message(json.dumps(doc))
        assert info.value.path == "content[1].data"
        doc["content"] = [{"type": "video"}]
        with pytest.raises(CodecError, match="'text', 'image' or 'document'") as info:
            decode_message(json.dumps(doc))
        assert info.value.path == "content[0].type"
        doc["content"] = []
        with pytest.raises(CodecError, match="non-empty array of parts"):
            decode_message(json.dumps(doc))

    @given(call=tool_calls(), invalid=st.none() | texts(30))
    def test_tool_calls_keep_invalid_arguments(self, call: ToolCall, invalid: str | None) -> None:
        """A call's arguments and the raw text of invalid arguments survive."""
        value = ToolCall(call.id, call.name, call.arguments, invalid_arguments=invalid)
        assert decode(encode(value), ToolCall) == value

    @given(usage=usages())
    def test_usage_round_trips(self, usage: Usage) -> None:
        """Token counts and the context window survive."""
        assert decode(encode(usage), Usage) == usage

    @given(config=run_configs(nested=True))
    def test_run_configs_round_trip(self, config: RunConfig) -> None:
        """Every RunConfig field a resume needs comes back (ids, lineage, limits, window)."""
        assert decode(encode(config), RunConfig) == config

    @given(checkpoint=checkpoints())
    def test_checkpoints_round_trip(self, checkpoint: Checkpoint) -> None:
        """Phase, pending calls, node, message, history, added, counters, usage and state."""
        doc = encode_checkpoint(checkpoint)
        back = decode_checkpoint(doc)
        assert back == checkpoint
        assert back.state == checkpoint.state
        assert decode(doc, Checkpoint) == checkpoint
        assert encode_checkpoint(back) == doc

    def test_an_interrupt_payload_round_trips(self) -> None:
        """A checkpoint's payload (an approval request) comes back deep-frozen and equal."""
        payload = freeze(
            {"type": "tool_review", "calls": [{"id": "c1", "allowed": ["approve", "reject"]}]}
        )
        checkpoint = _checkpoint(payload=payload)
        back = decode_checkpoint(encode_checkpoint(checkpoint))
        assert back.payload == payload
        assert back == checkpoint
        with pytest.raises(CodecError) as info:
            encode_checkpoint(_checkpoint(payload={"calls": [object()]}))
        assert info.value.path == "payload.calls[0]"

    @given(state=layer_states())
    def test_layer_state_round_trips_with_floats(self, state: dict[str, Any]) -> None:
        """Layer state (JSON values, finite floats included) decodes deep-frozen and equal."""
        doc = encode_state(state)
        back = decode_state(doc)
        assert back == freeze(state)
        assert isinstance(back, FrozenDict)
        assert encode_state(back) == doc
        assert decode(doc, FrozenDict) == back

    def test_float_bits_survive(self) -> None:
        """Floats keep their exact value and sign (-0.0, subnormals, huge)."""
        values = [-0.0, 5e-324, 1e308, 0.1 + 0.2, -1.5]
        back = decode_state(encode_state({"x": values}))["x"]
        assert [math.copysign(1, v) for v in back] == [math.copysign(1, v) for v in values]
        assert list(back) == values


class TestCanonical:
    """Equal values give equal bytes; documents are compact, sorted, pure ASCII."""

    @given(message=_rich_messages())
    def test_key_order_does_not_change_the_bytes(self, message: Message) -> None:
        """The same message built with its mappings in another order encodes identically."""
        rebuilt = message.evolve(metadata=_reordered(thaw(message.metadata)))
        if isinstance(message, AssistantMessage):
            calls = tuple(
                ToolCall(
                    c.id,
                    c.name,
                    _reordered(thaw(c.arguments)),
                    invalid_arguments=c.invalid_arguments,
                )
                for c in message.tool_calls
            )
            rebuilt = rebuilt.evolve(tool_calls=calls)
        assert rebuilt == message
        assert encode_message(rebuilt) == encode_message(message)

    @given(state=layer_states(), other=layer_states())
    def test_equal_states_equal_bytes_and_different_differ(
        self, state: dict[str, Any], other: dict[str, Any]
    ) -> None:
        """Two states encode to the same document exactly when they are the same JSON."""
        same_json = json.dumps(state, sort_keys=True) == json.dumps(other, sort_keys=True)
        assert (encode_state(state) == encode_state(other)) == same_json
        assert encode_state(_reordered(state)) == encode_state(state)

    @given(message=_rich_messages())
    def test_documents_are_sorted_compact_ascii(self, message: Message) -> None:
        """Sorted keys, no whitespace between tokens, ASCII only: the documented canonical form."""
        doc = encode_message(message)
        assert doc.isascii()
        parsed = json.loads(doc)
        assert doc == json.dumps(parsed, sort_keys=True, separators=(",", ":"))

    def test_defaults_are_left_out(self) -> None:
        """A plain user message is just its role, content and version."""
        assert encode_message(UserMessage("hi")) == '{"content":"hi","role":"user","v":1}'

    @given(history=histories(min_turns=1, max_turns=3), extra=histories(max_turns=20))
    def test_a_message_document_does_not_depend_on_the_history(
        self, history: tuple[Message, ...], extra: tuple[Message, ...]
    ) -> None:
        """The bytes of a step's message are the same whatever came before it."""
        last = history[-1]
        alone = encode_messages([last])[0]
        assert encode_messages([*extra, last])[-1] == alone


# ---------------------------------------------------------------------------------------
# rejection


def _corruptions(obj: Any, path: str = "") -> list[tuple[str, Callable[[], None]]]:
    """(path, mutate) for every schema field of a decoded document, free JSON excluded."""
    free = ("metadata", "arguments", "configurable", "state")
    found: list[tuple[str, Callable[[], None]]] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if (key == "v" or key == "payload") and not path:
                continue  # the version has its own tests; a payload is any JSON value
            where = f"{path}.{key}" if path else key
            wrong: Any
            if isinstance(value, bool):
                wrong = "yes"
            elif isinstance(value, (int, str)):
                wrong = [value] if isinstance(value, int) else 12345
            elif isinstance(value, dict):
                wrong = [1]
            else:
                wrong = {"not": "an array"}

            def mutate(o: dict[str, Any] = obj, k: str = key, w: Any = wrong) -> None:
                o[k] = w

            found.append((where, mutate))
            if key not in free:
                found += _corruptions(value, where)
    elif isinstance(obj, list):
        for index, item in enumerate(obj):
            found += _corruptions(item, f"{path}[{index}]")
    return found


class TestRejects:
    """Malformed or newer documents raise CodecError naming the path; nothing half built."""

    def test_a_newer_version_is_refused(self) -> None:
        """A document from a newer tinyctx names the version and the path ``v``."""
        doc = json.dumps({"v": CODEC_VERSION + 1, "role": "user", "content": "x"})
        with pytest.raises(CodecError, match="newer tinyctx") as info:
            decode_message(doc)
        assert info.value.path == "v"
        with pytest.raises(CodecError, match=r"messages\[1\]\.v: schema version 2"):
            decode_messages([encode_message(UserMessage("a")), doc])

    @pytest.mark.parametrize("version", [None, 0, -1, "1", 1.0, True])
    def test_a_missing_or_bad_version_is_refused(self, version: Any) -> None:
        """No version, or one that is not a positive integer, is malformed."""
        obj: dict[str, Any] = {"role": "user", "content": "x"}
        if version is not None:
            obj["v"] = version
        with pytest.raises(CodecError) as info:
            decode_message(json.dumps(obj))
        assert info.value.path == "v"

    @given(checkpoint=checkpoints(), data=st.data())
    def test_any_wrong_field_in_a_checkpoint_is_named(
        self, checkpoint: Checkpoint, data: st.DataObject
    ) -> None:
        """Corrupting any schema field of a checkpoint raises CodecError at exactly that path."""
        obj = json.loads(encode_checkpoint(checkpoint))
        corruptions = _corruptions(obj)
        path, mutate = data.draw(st.sampled_from(corruptions))
        mutate()
        with pytest.raises(CodecError) as info:
            decode_checkpoint(json.dumps(obj))
        assert info.value.path == path, str(info.value)

    @given(history=histories(min_turns=1, pending=True), data=st.data())
    def test_any_wrong_field_in_a_message_list_is_named(
        self, history: tuple[Message, ...], data: st.DataObject
    ) -> None:
        """The error of a bad message names its index and field: ``messages[3].content``."""
        docs = list(encode_messages(history))
        index = data.draw(st.integers(0, len(docs) - 1))
        obj = json.loads(docs[index])
        path, mutate = data.draw(st.sampled_from(_corruptions(obj)))
        mutate()
        docs[index] = json.dumps(obj)
        with pytest.raises(CodecError) as info:
            decode_messages(docs)
        assert info.value.path == f"messages[{index}].{path}", str(info.value)

    @given(message=_rich_messages(), data=st.data())
    def test_missing_required_and_unknown_fields_are_named(
        self, message: Message, data: st.DataObject
    ) -> None:
        """A dropped required field, or a field this version does not know, is named."""
        obj = json.loads(encode_message(message))
        obj["surprise"] = 1
        with pytest.raises(CodecError, match="unexpected field") as info:
            decode_message(json.dumps(obj))
        assert info.value.path == "surprise"
        del obj["surprise"]
        required = [k for k in ("role", "content", "tool_call_id") if k in obj]
        if isinstance(message, AssistantMessage):
            required.remove("content") if "content" in required else None
        key = data.draw(st.sampled_from(required))
        del obj[key]
        with pytest.raises(CodecError, match="missing") as info:
            decode_message(json.dumps(obj))
        assert info.value.path == key

    @given(message=_rich_messages(), data=st.data())
    def test_truncated_documents_are_refused(self, message: Message, data: st.DataObject) -> None:
        """Any cut of a document (a torn write) is not JSON: CodecError, no message."""
        doc = encode_message(message)
        cut = data.draw(st.integers(0, len(doc) - 1))
        with pytest.raises(CodecError, match="not JSON"):
            decode_message(doc[:cut])

    @pytest.mark.parametrize(
        "doc",
        [
            "[]",
            '"text"',
            "null",
            "1",
            '{"v":1,"role":"user","content":"x"} trailing',
            "{}",
            b"\xff",
        ],
    )
    def test_documents_that_are_not_objects_are_refused(self, doc: str | bytes) -> None:
        """Only a JSON object with a version is a document."""
        with pytest.raises(CodecError):
            decode_message(doc)

    def test_a_wrong_role_is_named_with_the_allowed_ones(self) -> None:
        """An unknown role lists the roles that exist; decode(type) checks the role too."""
        with pytest.raises(CodecError, match="allowed: system, user, assistant, tool"):
            decode_message('{"v":1,"role":"robot","content":"x"}')
        with pytest.raises(CodecError, match="expected a ToolResult"):
            decode(encode_message(UserMessage("x")), ToolResult)

    def test_a_long_decode_leaves_the_garbage_collector_as_it_found_it(self) -> None:
        """decode_messages pauses the cyclic collector for a long thread and restores it,
        on success and on error, and never enables one the application disabled."""
        docs = list(encode_messages([UserMessage(f"m{i}") for i in range(100)]))
        assert gc.isenabled()
        assert len(decode_messages(docs)) == 100
        assert gc.isenabled()
        with pytest.raises(CodecError, match=r"messages\[99\]"):
            decode_messages([*docs[:99], "{"])
        assert gc.isenabled()
        gc.disable()
        try:
            decode_messages(docs)
            assert not gc.isenabled()
        finally:
            gc.enable()

    def test_duplicate_call_ids_are_refused(self) -> None:
        """Two calls with one id in one message cannot be decoded into a message."""
        call = {"id": "c1", "name": "search"}
        doc = json.dumps({"v": 1, "role": "assistant", "tool_calls": [call, call]})
        with pytest.raises(CodecError, match="duplicate tool call id"):
            decode_message(doc)

    def test_run_config_values_are_checked_by_run_config(self) -> None:
        """A config the RunConfig validators refuse names the field under run_config."""
        obj = json.loads(encode_checkpoint(_checkpoint()))
        obj["run_config"]["max_model_calls"] = 0
        with pytest.raises(CodecError) as info:
            decode_checkpoint(json.dumps(obj))
        assert info.value.path == "run_config.max_model_calls"
        assert "integer >= 1" in info.value.problem


def _checkpoint(**changes: Any) -> Checkpoint:
    base = Checkpoint(
        run_config=RunConfig(run_id="r1", thread_id="t1"),
        phase="before_model",
        pending=(),
        node="approval",
        message="ok?",
        messages=(SystemMessage("sys"), UserMessage("hi")),
        added=(UserMessage("hi"),),
    )
    return base if not changes else Checkpoint(**{**_fields(base), **changes})


def _fields(checkpoint: Checkpoint) -> dict[str, Any]:
    import attrs

    return {a.name: getattr(checkpoint, a.name) for a in attrs.fields(Checkpoint)}


class TestEncodingRefusals:
    """What is not JSON is refused at encoding time, naming its path; nothing is written."""

    @pytest.mark.parametrize(
        ("metadata", "path"),
        [
            ({"a": {"b": [1, object()]}}, "metadata.a.b[1]"),
            ({"a": {1: "x"}}, "metadata.a"),
            ({"score": math.nan}, "metadata.score"),
            ({"x y": math.inf}, 'metadata["x y"]'),
            ({"s": b"raw"}, "metadata.s"),
        ],
    )
    def test_non_json_metadata_is_named(self, metadata: dict[str, Any], path: str) -> None:
        """Objects, non-string keys, NaN/infinity and bytes are not JSON values."""
        with pytest.raises(CodecError) as info:
            encode_messages([UserMessage("ok"), UserMessage("x", metadata=metadata)])
        assert info.value.path == f"messages[1].{path}"
        assert " a object" not in str(info.value) and " a int" not in str(info.value)

    def test_checkpoint_paths_name_the_nested_field(self) -> None:
        """A bad value deep in a checkpoint is named from the top (a bad tool argument
        cannot get that far: a ToolCall refuses it when built)."""
        with pytest.raises(TypeError, match="ToolCall 'c1' \\(run\\): argument 'cmd'"):
            ToolCall("c1", "run", {"cmd": object()})
        bad_config = _checkpoint(
            run_config=RunConfig(run_id="r", thread_id="t", configurable={"view": object()})
        )
        with pytest.raises(CodecError) as info:
            encode_checkpoint(bad_config)
        assert info.value.path == "run_config.configurable.view"
        assert "an object is not a JSON value" in str(info.value)
        with pytest.raises(CodecError) as info:
            encode_checkpoint(_checkpoint(state={"Layer": {"x": object()}}))
        assert info.value.path == "state.Layer.x"

    def test_unknown_message_types_are_refused(self) -> None:
        """A Message subclass the codec does not know cannot be written (it would not load)."""

        class Custom(UserMessage):
            pass

        with pytest.raises(CodecError, match="cannot be encoded"):
            encode_message(Custom("x"))
        with pytest.raises(CodecError, match="cannot be encoded"):
            encode(object())  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="cannot decode"):
            decode("{}", int)

    @given(value=json_values)
    def test_json_values_in_arguments_round_trip(self, value: Any) -> None:
        """Any JSON value as a tool argument comes back deep-frozen and equal."""
        call = ToolCall("c1", "run", {"value": value})
        message = AssistantMessage("", (call,))
        assert decode_message(encode_message(message)) == message


_wide_numbers = st.recursive(
    st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([2**63 - 1, 2**63, -(2**63), 2**64, -(2**64) - 1, 10**30, 1e19, -1e19])
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


class TestFastReader:
    """The fast parser (orjson) never changes what a document decodes to."""

    @given(value=_wide_numbers)
    def test_numbers_of_any_size_keep_their_type_and_value(self, value: Any) -> None:
        """Integers past 64 bits stay ints and floats stay floats, in arguments and metadata."""
        call = ToolCall("c1", "run", {"value": value})
        message = AssistantMessage("", (call,), metadata={"m": value})
        decoded = decode_message(encode_message(message))
        assert decoded == message
        want = json.dumps(value, sort_keys=True)  # the type of each number shows in the text
        arguments = decoded.tool_calls[0].arguments
        assert json.dumps(thaw(arguments["value"]), sort_keys=True) == want
        assert json.dumps(thaw(decoded.metadata["m"]), sort_keys=True) == want

    @given(value=_wide_numbers)
    def test_numbers_beside_content_parts_keep_their_type(self, value: Any) -> None:
        """A message with parts (read by the strict reader) keeps big integers as ints."""
        message = UserMessage((TextPart("see"), image_part()), metadata={"m": value})
        decoded = decode_message(encode_message(message))
        assert decoded == message
        want = json.dumps(value, sort_keys=True)
        assert json.dumps(thaw(decoded.metadata["m"]), sort_keys=True) == want

    @given(history=histories(pending=True))
    def test_a_history_decodes_as_the_stdlib_parser_reads_it(
        self, history: tuple[Message, ...]
    ) -> None:
        """decode_messages equals building every message from the stdlib parser's objects."""
        docs = encode_messages(history)
        strict = tuple(tinyctx.codec._message_from(json.loads(doc)) for doc in docs)
        assert decode_messages(docs) == strict == tuple(history)

    def test_a_flat_object_is_adopted_but_still_frozen(self) -> None:
        """A decoded tool call's arguments are read-only however they were built."""
        decoded = decode_message(
            encode_message(AssistantMessage("", (ToolCall("c", "t", {"a": [1]}),)))
        )
        arguments = decoded.tool_calls[0].arguments
        assert arguments["a"] == (1,)
        with pytest.raises(TypeError):
            arguments["b"] = 2  # type: ignore[index]


# strings shaped like the start of a message document, so splitting meets its edge cases
_DOC_TAILS = st.sampled_from(
    ["", "}", ',"role":"user","v":1}', ",}", " ,", ',"content":"again","role":"user","v":1}', ","]
)


@st.composite
def _doc_like(draw: st.DrawFn) -> str:
    text = draw(texts())
    spelled = json.dumps(text, ensure_ascii=draw(st.booleans()))
    return '{"content":' + spelled + draw(_DOC_TAILS)


def _outcome(docs: Any) -> tuple[str, Any]:
    try:
        return ("ok", decode_messages(docs))
    except CodecError as exc:
        return ("error", str(exc))


class TestSplitDocuments:
    """A document kept as head and text reads, joins and decodes exactly as the whole one."""

    @given(value=st.text() | _doc_like())
    def test_splitting_then_joining_gives_back_any_string(self, value: str) -> None:
        """join_document(*split_document(s)) == s for every string, byte for byte."""
        head, text = split_document(value)
        assert join_document(head, text) == value
        if text is None:
            assert head == value

    @given(history=histories(pending=True))
    def test_a_history_kept_split_decodes_and_reads_as_its_documents(
        self, history: tuple[Message, ...]
    ) -> None:
        """Every text content is taken out; the documents read back and decode unchanged."""
        docs = encode_messages(history)
        split = SplitDocuments([split_document(doc) for doc in docs])
        for message, (head, text) in zip(history, split.rows, strict=True):
            content = getattr(message, "content", None)
            if type(content) is str and content:
                surrogate = any(0xD800 <= ord(c) <= 0xDFFF for c in content)
                assert text == (None if surrogate else content)
                assert text is None or head.startswith(TEXT_HOLE)
        assert decode_messages(split) == tuple(history)
        assert split == docs and docs == split and hash(split) == hash(docs)
        assert list(split) == list(docs) and len(split) == len(docs)
        assert tuple(split[1:]) == docs[1:]
        if docs:
            assert split[-1] == docs[-1]

    @pytest.mark.parametrize(
        "doc",
        [
            '{"content":"x","role":"user","v":2}',
            '{"content":"x","role":"user","v":1,"extra":1}',
            '{"content":"x","role":"tool","tool_call_id":5,"v":1}',
            '{"content":"x","role":"tool","v":1}',
            '{"content":"x","role":"nobody","v":1}',
            '{"content":"x","role":"user","v":1.0}',
            '{"content":"x","metadata":{"n":123456789012345678901234567890},"role":"user","v":1}',
            '{"content":"first","content":"second","role":"user","v":1}',
            '{"content":"x","role":"assistant","tool_calls":[{"id":"a","name":"t"},'
            '{"id":"a","name":"t"}],"v":1}',
            '{"content":"x",}',
            '{"content":"x"}',
        ],
    )
    def test_a_malformed_or_unusual_document_decodes_as_the_whole_document(self, doc: str) -> None:
        """The same message or the same error naming the same path, split or not."""
        split = SplitDocuments([split_document("{}"), split_document(doc)])
        assert _outcome(split) == _outcome(("{}", doc))

    def test_a_repeated_content_key_decodes_to_the_last_one_either_way(self) -> None:
        """JSON's last-wins rule holds for a split document too."""
        doc = '{"content":"first","content":"second","role":"user","v":1}'
        assert split_document(doc)[1] == "first"
        split = SplitDocuments([split_document(doc)])
        assert decode_messages(split) == (UserMessage("second"),)

    @given(message=messages())
    def test_a_head_read_alone_is_refused_never_a_message_without_its_text(
        self, message: Message
    ) -> None:
        """A reader that knows nothing of splitting (an older release reading the stored
        document only) gets a CodecError for every role, never an empty-text message."""
        head, text = split_document(encode_message(message))
        if text is not None:
            with pytest.raises(CodecError, match="content"):
                decode_message(head)

    def test_a_text_beside_a_head_without_its_hole_is_refused_naming_the_message(self) -> None:
        """A pair split_document did not make (a damaged row) is an error, not a guess."""
        good = split_document(encode_message(UserMessage("fine")))
        bad = ('{"role":"user","v":1}', "lost")
        with pytest.raises(CodecError, match=r"messages\[1\].*head must start with"):
            decode_messages(SplitDocuments([good, bad]))
        with pytest.raises(ValueError, match="head starts with"):
            join_document(*bad)

    def test_anything_but_a_string_is_left_whole(self) -> None:
        """A store handed bytes keeps them as they are (the split reads only strings)."""
        doc = encode_message(UserMessage("hi")).encode()
        assert split_document(cast(str, doc)) == (doc, None)

    def test_a_lone_surrogate_stays_in_the_document(self) -> None:
        """Text a database cannot hold as UTF-8 is not taken out, and still round-trips."""
        doc = encode_message(UserMessage("half \ud800 pair"))
        assert split_document(doc) == (doc, None)
        assert decode_messages(SplitDocuments([split_document(doc)])) == (
            UserMessage("half \ud800 pair"),
        )
