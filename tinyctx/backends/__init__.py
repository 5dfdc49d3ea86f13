"""The stores: one module per backend.

- :class:`tinyctx.backends.memory.MemoryStore` — in the process (tests, one-process apps);
- :class:`tinyctx.backends.sqlite.SqliteStore` — one SQLite file, the embedded default;
- :class:`tinyctx.backends.postgres.PostgresStore` — PostgreSQL through psycopg 3 and
  psycopg_pool (``pip install 'tinyctx[postgres]'``);
- :class:`tinyctx.backends.redis.RedisStore` — Redis through redis-py
  (``pip install 'tinyctx[redis]'``).

Each implements :class:`tinyctx.store_protocols.Store` (key/value data and append-only
notes), :class:`tinyctx.store_protocols.NoteBatchStore` and
:class:`tinyctx.threads.ThreadStore`, and passes the same conformance suite. Importing a
backend module never needs its driver; constructing a store without it raises
``ImportError`` with the install command. :mod:`tinyctx.stores` gathers the common names.
"""

from __future__ import annotations

__all__: list[str] = []
