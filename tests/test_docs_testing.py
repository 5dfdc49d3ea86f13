"""docs/testing-your-layer.md runs: its Python blocks, in order, are one passing test module."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

PAGE = Path(__file__).resolve().parents[1] / "docs" / "testing-your-layer.md"
BLOCKS = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

CONFTEST = """
import pytest
from hypothesis import settings

# the page runs as written; a loaded CI machine must not fail on a slow first example
settings.register_profile("docs", deadline=None, max_examples=50)
settings.load_profile("docs")


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request):
    return request.param
"""


def page_code() -> str:
    return "\n\n".join(BLOCKS.findall(PAGE.read_text(encoding="utf-8")))


class TestTestingYourLayerPage:
    """The "Testing your layer" page shows a short property test and every example runs."""

    def test_the_property_test_is_at_most_ten_lines(self) -> None:
        code = page_code()
        start = code.index("@pytest.mark.anyio\n@given(request=requests())")
        lines = code[start:].split("\n\n\n")[0].strip().splitlines()
        assert lines[2].startswith("async def test_keep_recent_never_orphans_a_tool_call")
        assert len(lines) <= 10

    @pytest.mark.slow  # the page's property and stateful examples at full size
    def test_every_example_on_the_page_passes(self, pytester: pytest.Pytester) -> None:
        code = page_code()
        assert code.count("def test_") >= 5
        pytester.makeconftest(CONFTEST)
        pytester.makepyfile(test_testing_your_layer=code)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error")
        # two backends for each async example, one run for the sync ones (three conformance
        # checks among them) and the machine
        result.assert_outcomes(passed=14)

    def test_the_page_starts_with_the_one_line_check(self) -> None:
        """A new layer is conformance-checked in at most ten lines, the first thing shown."""
        code = page_code()
        assert code.index("check_layer(Shout())") < code.index("@given")
        start = code.index("class Shout(Layer):")
        end = code.index("check_layer(Shout())") + len("check_layer(Shout())")
        lines = [line for line in code[start:end].splitlines() if line.strip()]
        assert len(lines) <= 10
