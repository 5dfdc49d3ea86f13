"""Real PostgreSQL and Redis servers for the tests that need them.

The URLs come from ``TINYCTX_TEST_POSTGRES_URL`` / ``TINYCTX_TEST_REDIS_URL`` (``.ci/run``
and ``source .ci/services.sh && tinyctx_services_start`` set them). Without them, the
session starts both servers itself through ``.ci/services.sh`` when their programs are
installed: loopback, a temporary directory, ports picked at start, stopped at the end.
Otherwise the tests that need a server skip with one reason, unless
``TINYCTX_REQUIRE_SERVERS=1`` (CI), where a missing server is an error.

Each test gets its own PostgreSQL schema or Redis key prefix, removed afterwards, so tests
never see each other's data.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ROOT / ".ci" / "services.sh"
INSTALL_HINT = (
    "set TINYCTX_TEST_POSTGRES_URL and TINYCTX_TEST_REDIS_URL, or install the servers "
    "(apt-get install postgresql redis-server) so the tests start them; .ci/run always does"
)


@dataclass(frozen=True)
class Servers:
    """Where the test servers listen; ``None`` and ``reason`` when one is unavailable."""

    postgres: str | None
    redis: str | None
    reason: str = ""


def _have_programs() -> bool:
    pg = shutil.which("pg_ctl") or any(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return bool(pg and shutil.which("redis-server") and shutil.which("bash"))


def start_services() -> dict[str, str]:
    """Start both servers with ``.ci/services.sh`` (never installing); their variables.

    Raises ``RuntimeError`` with the script's output when they do not start.
    """
    done = subprocess.run(
        ["bash", str(SERVICES), "start", "--no-install"],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"starting the test servers failed: {done.stderr.strip()[-2000:]}")
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def stop_services(directory: str) -> None:
    """Stop the servers ``start_services`` started in ``directory`` and remove it."""
    subprocess.run(
        ["bash", str(SERVICES), "stop", directory],
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=True,
        capture_output=True,
    )


def _start() -> tuple[Servers, str | None]:
    if not _have_programs():
        return Servers(None, None, f"no test database servers: {INSTALL_HINT}"), None
    try:
        found = start_services()
    except RuntimeError as exc:
        return Servers(None, None, str(exc)), None
    servers = Servers(found["TINYCTX_TEST_POSTGRES_URL"], found["TINYCTX_TEST_REDIS_URL"])
    return servers, found["TINYCTX_SERVICES_DIR"]


@pytest.fixture(scope="session")
def database_servers() -> Iterator[Servers]:
    """The session's PostgreSQL and Redis (from the environment, or started here)."""
    postgres = os.environ.get("TINYCTX_TEST_POSTGRES_URL") or None
    redis = os.environ.get("TINYCTX_TEST_REDIS_URL") or None
    started: str | None = None
    if postgres and redis:
        servers = Servers(postgres, redis)
    else:
        servers, started = _start()
        servers = Servers(postgres or servers.postgres, redis or servers.redis, servers.reason)
    try:
        yield servers
    finally:
        if started is not None:
            stop_services(started)


def _require(url: str | None, servers: Servers) -> str:
    if url is None:
        if os.environ.get("TINYCTX_REQUIRE_SERVERS") == "1":
            pytest.fail(f"TINYCTX_REQUIRE_SERVERS=1 but {servers.reason}")
        pytest.skip(servers.reason)
    return url


@pytest.fixture
def postgres_url(database_servers: Servers) -> str:
    """The test PostgreSQL's URL (skips, or fails under CI, when there is none)."""
    return _require(database_servers.postgres, database_servers)


@pytest.fixture
def redis_url(database_servers: Servers) -> str:
    """The test Redis's URL (skips, or fails under CI, when there is none)."""
    return _require(database_servers.redis, database_servers)


def unique_name(kind: str) -> str:
    """A fresh schema name or key prefix for one test."""
    return f"t_{kind}_{uuid.uuid4().hex[:16]}"


def drop_postgres_schema(url: str, schema: str) -> None:
    """Remove everything a test stored in PostgreSQL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def drop_redis_prefix(url: str, prefix: str) -> None:
    """Remove every key a test stored in Redis under ``prefix``."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    finally:
        client.close()


@pytest.fixture
def postgres_schema(postgres_url: str) -> Iterator[str]:
    """A schema name no other test uses, dropped after the test."""
    schema = unique_name("pg")
    yield schema
    drop_postgres_schema(postgres_url, schema)


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix no other test uses, its keys deleted after the test."""
    prefix = unique_name("redis") + ":"
    yield prefix
    drop_redis_prefix(redis_url, prefix)


BACKENDS = ("memory", "sqlite", "postgres", "redis")
"""Every store backend, for tests parametrized over all of them."""


def make_backend(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A new, empty store of ``kind``; the server's fixtures clean up after the test.

    Returns a MemoryStore, SqliteStore, PostgresStore or RedisStore (each a Store, a
    NoteBatchStore and a ThreadStore); the caller closes it.
    """
    from tinyctx.stores import MemoryStore, SqliteStore

    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SqliteStore(tmp_path / f"{unique_name('sqlite')}.db")
    if kind == "postgres":
        from tinyctx.backends.postgres import PostgresStore

        url = request.getfixturevalue("postgres_url")
        return PostgresStore(url, schema=request.getfixturevalue("postgres_schema"))
    if kind == "redis":
        from tinyctx.backends.redis import RedisStore

        url = request.getfixturevalue("redis_url")
        return RedisStore(url, prefix=request.getfixturevalue("redis_prefix"))
    raise ValueError(f"unknown backend {kind!r}: allowed {', '.join(BACKENDS)}")
