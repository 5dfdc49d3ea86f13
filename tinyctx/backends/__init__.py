"""Stores for many workers on the databases an application already runs.

- :class:`tinyctx.backends.postgres.PostgresStore` — PostgreSQL through psycopg 3 and
  psycopg_pool (``pip install 'tinyctx[postgres]'``);
- :class:`tinyctx.backends.redis.RedisStore` — Redis through redis-py
  (``pip install 'tinyctx[redis]'``).

Each implements :class:`tinyctx.stores.Store` (key/value data and append-only notes),
:class:`tinyctx.stores.NoteBatchStore` and :class:`tinyctx.threads.ThreadStore` with the
semantics of :class:`tinyctx.stores.SqliteStore`, and passes the same conformance suite.
Importing a backend module never needs its driver; constructing a store without it raises
``ImportError`` with the install command.
"""

from __future__ import annotations

__all__: list[str] = []
