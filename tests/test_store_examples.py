"""The store conformance properties draw as many examples as ``$TINYCTX_STORE_EXAMPLES`` says."""

from __future__ import annotations

import pytest
from hypothesis import settings

from tinyctx.testing._store_kit import STORE_EXAMPLES_ENV, store_property_settings


class TestStoreExamples:
    """A quick run draws fewer store examples and a deep run more, from one variable."""

    def test_the_variable_sets_the_count(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A positive count becomes the properties' max_examples."""
        monkeypatch.setenv(STORE_EXAMPLES_ENV, "7")
        assert store_property_settings().max_examples == 7

    def test_unset_follows_the_profile(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without the variable the loaded hypothesis profile decides."""
        monkeypatch.delenv(STORE_EXAMPLES_ENV, raising=False)
        assert store_property_settings().max_examples == settings.default.max_examples

    @pytest.mark.parametrize("raw", ["0", "-3", "many", "2.5"])
    def test_a_bad_count_is_refused(self, monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
        """Anything but a positive integer is an error naming the variable."""
        monkeypatch.setenv(STORE_EXAMPLES_ENV, raw)
        with pytest.raises(ValueError, match=STORE_EXAMPLES_ENV):
            store_property_settings()
