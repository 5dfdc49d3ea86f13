"""Stores: namespaced key/value data and append-only notes that outlive a session.

The names every store shares, gathered in one place (their homes: the protocols in
:mod:`tinyctx.store_protocols`, the errors in :mod:`tinyctx.store_errors`,
:class:`MemoryStore` in :mod:`tinyctx.backends.memory`, :class:`SqliteStore` in
:mod:`tinyctx.backends.sqlite`).

:class:`MemoryStore` lives in the process; :class:`SqliteStore` is the embedded default
for anything that must survive a restart (one file, WAL, a versioned schema migrated on
open). Both also implement :class:`NoteBatchStore`: several notes appended atomically.
"""

from __future__ import annotations

from .backends.memory import MemoryStore
from .backends.sqlite import SCHEMA_VERSION, SqliteStore
from .store_errors import (
    StoreAuthenticationFailed,
    StoreClosed,
    StoreError,
    StoreSchemaError,
    StoreUnavailable,
    WriteOutcomeUnknown,
)
from .store_protocols import (
    Note,
    NoteBatchStore,
    NoteDeleteStore,
    Store,
    StoreRegistry,
    append_notes,
    check_fence,
    check_lease,
)

__all__ = [
    "Store",
    "Note",
    "StoreRegistry",
    "MemoryStore",
    "NoteBatchStore",
    "NoteDeleteStore",
    "append_notes",
    "check_fence",
    "check_lease",
    "SqliteStore",
    "SCHEMA_VERSION",
    "StoreError",
    "StoreSchemaError",
    "StoreClosed",
    "StoreAuthenticationFailed",
    "StoreUnavailable",
    "WriteOutcomeUnknown",
]
