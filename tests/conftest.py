"""Shared test configuration: both anyio backends (trio first), hypothesis profiles."""

from __future__ import annotations

import os
import sys

# each store property example writes real threads (PostgreSQL, Redis, SQLite, encrypted):
# the README command draws 50 of each, and .ci/run runs them again at the profile's 200
os.environ.setdefault("TINYCTX_STORE_EXAMPLES", "50")
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import HealthCheck, settings

# real PostgreSQL and Redis for the backend tests (tests/servers.py says where they come from)
from tests.servers import (  # noqa: F401
    database_servers,
    postgres_schema,
    postgres_url,
    redis_prefix,
    redis_url,
)

# compiled test modules and tinyctx are kept (in the gitignored __pycache__ folders) even
# where the environment asks Python not to write them: else every xdist worker rewrites
# and compiles all the test modules, and every subprocess a test starts (the command,
# worker processes) compiles tinyctx again
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "dev",
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# the README command and CI run the same thing: the "ci" profile (>= 200 examples)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# the library never configures logging; the test suite (an application) may: keep output quiet
structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(40), cache_logger_on_first_use=False
)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per core for the default group, whose tests spend about
    40% of their time waiting (on PostgreSQL and Redis, subprocesses, deadlines), so a
    core per worker sat idle that much; one per core for the slow group, whose crash
    trials time their kills and activity timeouts against a machine they do not share."""
    cores = os.cpu_count() or 1
    if "slow" in (config.option.markexpr or "") and "not slow" not in config.option.markexpr:
        return cores
    return min(2 * cores, cores + 4)


def _find_shared_data() -> Path | None:
    """Real data lives beside the checkout (``../shared/data``), or where the env var says."""
    candidates = [os.environ.get("TINYCTX_SHARED_DATA", "")]
    repo = Path(__file__).resolve().parents[1]
    candidates += [str(repo.parent / "shared" / "data"), "/work/shared/data"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "transcripts").is_dir():
            return Path(candidate)
    return None


SHARED_DATA = _find_shared_data()


@pytest.fixture(params=[pytest.param("trio", id="trio"), pytest.param("asyncio", id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if SHARED_DATA is None:
        pytest.skip("shared data not found (set TINYCTX_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture
def all_log_levels() -> Any:
    """Let every level through structlog for this test (capture_logs keeps level filtering)."""
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(0))
    yield
    structlog.configure(**before)
