"""Errors that name their cause: a stored integer too long for Python's int conversion
(a CodecError with its path), an unknown --price model (the option and the known models)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import Agent, Session, SqliteStore, UserMessage, codec
from tinyctx.cli import main
from tinyctx.codec import CodecError
from tinyctx.cost import PRICES
from tinyctx.testing import ScriptedModel
from tinyctx.threads import ThreadWrite

_LIMIT = 4300


class TestHugeIntegers:
    """An integer literal past Python's digit limit is a CodecError naming its path."""

    @given(
        digits=st.integers(_LIMIT + 1, _LIMIT + 3000),
        sign=st.sampled_from(["", "-"]),
        where=st.sampled_from(["metadata", "nested", "list"]),
    )
    def test_a_stored_huge_integer_names_its_path(self, digits: int, sign: str, where: str) -> None:
        """decode_message and decode_messages raise CodecError with the integer's path and
        its digit count, never a bare ValueError."""
        meta = {"metadata": {"n": 0}, "nested": {"a": {"b": 0}}, "list": {"l": [1, 0]}}[where]
        path = {"metadata": "metadata.n", "nested": "metadata.a.b", "list": "metadata.l[1]"}
        doc = codec.encode_message(UserMessage("hi", metadata=meta))
        huge = sign + "9" * digits
        bad = (
            doc.replace(":0", ":" + huge, 1) if where != "list" else doc.replace(",0]", f",{huge}]")
        )
        with pytest.raises(CodecError) as caught:
            codec.decode_message(bad)
        assert caught.value.path == path[where]
        assert f"{digits} digits" in str(caught.value)
        with pytest.raises(CodecError) as caught:
            codec.decode_messages([doc, bad])
        assert caught.value.path == f"messages[1].{path[where]}"

    async def test_a_thread_holding_one_fails_to_open_with_the_path(self, tmp_path: Path) -> None:
        """A Session on a stored thread with such an integer raises CodecError naming
        messages[i] and the field."""
        doc = codec.encode_message(UserMessage("hi", metadata={"n": 1}))
        async with SqliteStore(tmp_path / "t.db") as store:
            await store.write(
                "t", ThreadWrite([doc, doc.replace(":1", ":" + "7" * 5000)]), expected_version=0
            )
            with pytest.raises(CodecError, match=r"messages\[1\]\.metadata\.n: an integer of 5000"):
                async with Session(Agent(model=ScriptedModel(["x"])), thread_id="t", store=store):
                    pass


class TestReplayPriceOption:
    """An unknown --price names the option and the models it could be."""

    def test_an_unknown_model_lists_the_known_ones(self) -> None:
        """Exit 2 with '--price', the model given and every built-in model; no internal
        function name."""
        err = io.StringIO()
        code = main(["replay", "--price", "nope-model"], out=io.StringIO(), err=err)
        text = err.getvalue()
        assert code == 2
        assert "--price nope-model: not a known model" in text
        assert all(model in text for model in PRICES)
        assert "price_for" not in text

    def test_models_of_a_price_file_are_the_ones_listed(self, tmp_path: Path) -> None:
        """With --prices FILE the list is that file's models."""
        prices = tmp_path / "prices.toml"
        prices.write_text(
            "[models.house-model]\ninput = 1.0\noutput = 2.0\n"
            "[models.other-model]\ninput = 1.0\noutput = 2.0\n"
        )
        err = io.StringIO()
        code = main(
            ["replay", "--prices", str(prices), "--price", "nope"], out=io.StringIO(), err=err
        )
        assert code == 2
        assert f"models in --prices {prices}: house-model, other-model" in err.getvalue()
