"""Values that JSON would read back changed are refused where they enter, naming the field:
a surrogate pair written as two code points (JSON joins its escapes into one character),
an integer past 4300 digits, a part URL no UTF-8 encoder accepts. Found by the write/read
symmetry property (tests/test_symmetry.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tinyctx import (
    ConfigError,
    DocumentPart,
    ImagePart,
    Interrupt,
    StopWithFinal,
    Suspend,
    ToolCall,
    UserMessage,
)
from tinyctx.codec import CodecError, decode_message, encode_message, encode_state
from tinyctx.formats._common import parse_arguments
from tinyctx.frozen import FrozenDict
from tinyctx.state import StateError, check_json

SPLIT = "smile \ud83d\ude00"  # two code points: JSON reads "\ud83d\ude00" back as one
JOINED = "smile \U0001f600"


class TestSplitSurrogatePairs:
    """A string holding a surrogate pair as two code points would come back as one
    character: refused; lone surrogates and real astral characters round-trip."""

    @pytest.mark.parametrize("where", ["value", "key"])
    def test_the_encoder_refuses_naming_the_path(self, where: str) -> None:
        """In metadata (a value or a key): CodecError naming the path and the fix."""
        metadata = {"a": [SPLIT]} if where == "value" else {"a": {SPLIT: 1}}
        with pytest.raises(CodecError, match="two code points.*valid_text") as raised:
            encode_message(UserMessage("hi", metadata=metadata))
        assert raised.value.path == ("metadata.a[0]" if where == "value" else "metadata.a")

    def test_lone_surrogates_and_astral_characters_round_trip(self) -> None:
        """What reads back as itself is kept exactly."""
        for text in ("\ud800", "x\udfff", "\udc00\ud800", JOINED, "\ud800" + JOINED):
            message = UserMessage("hi", metadata={text: [text]})
            assert decode_message(encode_message(message)) == message

    def test_control_outcomes_and_calls_refuse_when_built(self) -> None:
        """Interrupt and StopWithFinal text, payloads, suspension state, call arguments."""
        with pytest.raises(ValueError, match=r"^Interrupt\.message holds a surrogate pair"):
            Interrupt("review", SPLIT)
        with pytest.raises(ValueError, match=r"^Interrupt\.node holds a surrogate pair"):
            Interrupt(SPLIT)
        with pytest.raises(ValueError, match=r"^StopWithFinal\.text holds a surrogate pair"):
            StopWithFinal(SPLIT)
        with pytest.raises(TypeError, match=r"^Interrupt\.payload\[0\] holds a surrogate pair"):
            Interrupt("review", payload=[SPLIT])
        with pytest.raises(TypeError, match=r"^Suspend\.state\['k'\] key"):
            Suspend("review", state={"k": {SPLIT: 1}})
        with pytest.raises(TypeError, match="argument 'q' is not JSON: the string"):
            ToolCall("c1", "run", {"q": SPLIT})
        Interrupt("review", JOINED, payload=[JOINED, "\ud800"])  # these read back

    def test_layer_state_refuses_naming_the_layer(self) -> None:
        """check_json and the encoder name the layer and the path."""
        with pytest.raises(StateError, match=r"^layer\.k: the string"):
            check_json({"k": SPLIT}, "layer")
        with pytest.raises(CodecError, match="two code points") as raised:
            encode_state({"layer": FrozenDict({"k": SPLIT})})
        assert raised.value.path == "state.layer.k"

    def test_model_arguments_holding_one_are_invalid_arguments(self) -> None:
        """Parsed arguments holding raw split pairs are kept as text, not as a call a
        thread could not keep; JSON escapes of a pair are one character and fine."""
        raw = '{"q": "' + SPLIT + '"}'
        assert parse_arguments(raw) == ({}, raw)
        assert parse_arguments('{"q": "\\ud83d\\ude00"}') == ({"q": "\U0001f600"}, None)


class TestHugeIntegers:
    """An integer past 4300 digits is refused with the path, not a bare ValueError."""

    @pytest.mark.parametrize("number", [10**4300, -(10**5000)], ids=["4301-digits", "5001-digits"])
    def test_the_encoder_names_the_path(self, number: int) -> None:
        """CodecError at metadata.n[0]; 4300 digits are still written and read back."""
        with pytest.raises(CodecError, match="more than 4300 digits") as raised:
            encode_message(UserMessage("hi", metadata={"n": [number]}))
        assert raised.value.path == "metadata.n[0]"
        fits = UserMessage("hi", metadata={"n": [10**4299]})
        assert decode_message(encode_message(fits)) == fits

    def test_calls_and_layer_state_refuse_when_built(self) -> None:
        """ToolCall and check_json say so before anything is written."""
        with pytest.raises(TypeError, match="more than 4300 digits"):
            ToolCall("c1", "run", {"n": 10**4300})
        with pytest.raises(StateError, match="more than 4300 digits"):
            check_json([10**4300], "layer")


class TestPartUrls:
    """A part's URL with a lone surrogate is a ConfigError naming it (no UTF-8 encoder,
    so no provider, takes it), not a bare UnicodeEncodeError."""

    @pytest.mark.parametrize("build", [ImagePart, DocumentPart])
    def test_refused_naming_the_url(self, build: Any) -> None:
        """ImagePart(url=...) and DocumentPart(url=...)."""
        with pytest.raises(ConfigError, match=r"Part\.url=.*without lone surrogates"):
            build(url="https://example.com/\ud800.png")
        assert build(url="https://example.com/\u00e9.png").url.endswith("\u00e9.png")
