"""Encryption at rest: a store wrapper that encrypts what a thread and its notes say.

``EncryptedStore(inner, keys=[key])`` wraps any built-in store (or yours: it needs the
:class:`~tinyctx.stores.Store` and :class:`~tinyctx.threads.ThreadStore` methods it is
called with) and encrypts, before they reach the inner store, every message document
(appended, or a compaction's replacement), the checkpoint, the layers' thread state,
note texts and key/value values; it decrypts them as they come back (archive and windows
included). Leases, versions, thread ids, positions, note sequence numbers and metadata
stay readable, so the inner store's own logic (fencing, optimistic concurrency, listing,
compaction ranges, retention) works unchanged.

The cipher is Fernet from the ``cryptography`` package (AES-128-CBC with HMAC-SHA256,
authenticated; ``pip install 'tinyctx[encryption]'``); a key is
``cryptography.fernet.Fernet.generate_key()``. Key rotation: pass the new key first and
the old ones after it (``keys=[new, old]``): everything is written with the first and
read with any; :meth:`EncryptedStore.rotate_thread` rewrites one thread under the first
key (its old log is archived, still readable while the old key is listed), and a value
a key no longer listed encrypted raises :class:`DecryptionFailed` naming what it was.
A document without the ``tinyctx-enc:1:`` mark (written before the wrapper was used) is
read as it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from .backends._common import missing_extra
from .errors import ConfigError, TinyCtxError
from .lifecycle import ThreadWindow
from .retention import erase_thread
from .store_protocols import Note, note_texts
from .threads import (
    ArchivedRange,
    Compaction,
    Lease,
    ThreadRecord,
    ThreadWrite,
    Unchanged,
)
from .versions import ThreadVersion

try:
    from cryptography.fernet import Fernet, InvalidToken, MultiFernet
except ImportError as _exc:  # pragma: no cover - exercised without the extra
    _MISSING: ImportError | None = _exc
else:
    _MISSING = None

__all__ = ["EncryptedStore", "DecryptionFailed", "MARK"]

MARK: Final = "tinyctx-enc:1:"
"""What starts every encrypted value (the format's version is in it)."""


class DecryptionFailed(TinyCtxError):
    """A stored value no listed key decrypts (a key dropped too early, or tampering)."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(
            f"{what}: no key given to EncryptedStore decrypts it (was its key dropped from "
            "keys= before the data was rotated, or was the value changed?)"
        )


class EncryptedStore:
    """A store that encrypts bodies at rest (see the module docstring)."""

    def __init__(self, inner: Any, *, keys: Sequence[bytes | str]) -> None:
        owner = "EncryptedStore"
        if _MISSING is not None:
            raise missing_extra(owner, "cryptography", "encryption", _MISSING)
        if isinstance(keys, (str, bytes)) or not keys:
            raise ConfigError("keys", keys, "a non-empty list of Fernet keys", owner=owner)
        fernets = []
        for index, key in enumerate(keys):
            try:
                fernets.append(Fernet(key))
            except (TypeError, ValueError):
                raise ConfigError(
                    f"keys[{index}]",
                    "<hidden>",
                    "a Fernet key: 32 url-safe base64-encoded bytes (Fernet.generate_key())",
                    owner=owner,
                ) from None
        self.inner = inner
        self._cipher = MultiFernet(fernets)

    def __repr__(self) -> str:
        return f"<EncryptedStore over {self.inner!r}>"

    # -- the cipher ----------------------------------------------------------------------

    def _seal(self, value: Any) -> Any:
        """``value`` encrypted when it is a str (anything else goes on unchanged, for the
        inner store to refuse with its own error)."""
        if type(value) is not str:
            return value
        return MARK + self._cipher.encrypt(value.encode("utf-8", "surrogatepass")).decode()

    def _open(self, value: str | None, what: str) -> str | None:
        if value is None or not value.startswith(MARK):
            return value
        try:
            plain = self._cipher.decrypt(value[len(MARK) :].encode("ascii"))
        except (InvalidToken, UnicodeEncodeError):
            raise DecryptionFailed(what) from None
        return plain.decode("utf-8", "surrogatepass")

    def _open_all(self, docs: Sequence[str], what: str) -> tuple[str, ...]:
        return tuple(self._open(doc, f"{what}[{i}]") or "" for i, doc in enumerate(docs))

    def _seal_write(self, change: Any) -> Any:
        if not isinstance(change, ThreadWrite):
            return change
        compaction = change.compaction
        if isinstance(compaction, Compaction):
            compaction = Compaction(
                compaction.start,
                compaction.end,
                tuple(self._seal(doc) for doc in compaction.replacement),
            )
        checkpoint = change.checkpoint
        return ThreadWrite(
            append=tuple(self._seal(doc) for doc in change.append),
            compaction=compaction,
            checkpoint=checkpoint if isinstance(checkpoint, Unchanged) else self._seal(checkpoint),
            state=change.state if isinstance(change.state, Unchanged) else self._seal(change.state),
            run_id=change.run_id,
        )

    def _note(self, note: Note) -> Note:
        text = self._open(note.text, f"note {note.namespace!r}#{note.seq}")
        assert text is not None
        return attrs.evolve(note, text=text)

    # -- key/value and notes -------------------------------------------------------------

    async def get(self, namespace: str, key: str) -> Any | None:
        value = await self.inner.get(namespace, key)
        if isinstance(value, str) and value.startswith(MARK):
            return json.loads(self._open(value, f"value {namespace!r}/{key!r}") or "null")
        return value

    async def put(self, namespace: str, key: str, value: Any) -> None:
        try:
            encoded = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"EncryptedStore: the value must be JSON-serializable ({exc})"
            ) from None
        await self.inner.put(namespace, key, self._seal(encoded))

    async def delete(self, namespace: str, key: str) -> bool:
        return bool(await self.inner.delete(namespace, key))

    async def keys(self, namespace: str) -> list[str]:
        return list(await self.inner.keys(namespace))

    async def append_note(
        self, namespace: str, text: str, *, metadata: Mapping[str, Any] | None = None
    ) -> Note:
        (plain,) = note_texts((text,))
        note = await self.inner.append_note(namespace, self._seal(plain), metadata=metadata)
        return self._note(note)

    async def append_notes(
        self,
        namespace: str,
        texts: Sequence[str],
        *,
        metadata: Mapping[str, Any] | None = None,
        fence: Lease | None = None,
    ) -> list[Note]:
        sealed = [self._seal(t) for t in note_texts(texts)]
        notes = await self.inner.append_notes(namespace, sealed, metadata=metadata, fence=fence)
        return [self._note(n) for n in notes]

    async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]:
        return [self._note(n) for n in await self.inner.notes(namespace, limit=limit)]

    async def delete_notes(self, namespace: str) -> int:
        return int(await self.inner.delete_notes(namespace))

    # -- threads -------------------------------------------------------------------------

    async def load_thread(self, thread_id: str) -> ThreadRecord:
        record: ThreadRecord = await self.inner.load_thread(thread_id)
        what = f"thread {thread_id!r}"
        return ThreadRecord(
            record.thread_id,
            record.version,
            self._open_all(record.messages, f"{what} message"),
            self._open(record.checkpoint, f"{what} checkpoint"),
            self._open(record.state, f"{what} state"),
            record.lease,
        )

    async def write(
        self,
        thread_id: str,
        change: ThreadWrite,
        *,
        expected_version: int,
        lease: Lease | None = None,
    ) -> int:
        return int(
            await self.inner.write(
                thread_id, self._seal_write(change), expected_version=expected_version, lease=lease
            )
        )

    async def load_window(
        self, thread_id: str, *, stop: int | None = None, count: int
    ) -> ThreadWindow:
        window: ThreadWindow = await self.inner.load_window(thread_id, stop=stop, count=count)
        what = f"thread {thread_id!r}"
        return attrs.evolve(
            window,
            messages=self._open_all(window.messages, f"{what} message"),
            checkpoint=self._open(window.checkpoint, f"{what} checkpoint"),
            state=self._open(window.state, f"{what} state"),
        )

    async def versions(self, thread_id: str) -> list[ThreadVersion]:
        return list(await self.inner.versions(thread_id))

    async def layers_as_of(self, thread_id: str, version: int) -> tuple[str | None, str | None]:
        checkpoint, state = await self.inner.layers_as_of(thread_id, version)
        what = f"thread {thread_id!r} as of version {version}"
        return self._open(checkpoint, f"{what} checkpoint"), self._open(state, f"{what} state")

    async def archived(self, thread_id: str) -> list[ArchivedRange]:
        ranges: list[ArchivedRange] = await self.inner.archived(thread_id)
        return [
            attrs.evolve(r, messages=self._open_all(r.messages, f"thread {thread_id!r} archive"))
            for r in ranges
        ]

    async def prune_archive(self, thread_id: str, *, older_than: float) -> int:
        return int(await self.inner.prune_archive(thread_id, older_than=older_than))

    async def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> Lease:
        lease: Lease = await self.inner.acquire_lease(thread_id, owner, ttl)
        return lease

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        renewed: Lease = await self.inner.renew_lease(lease, ttl)
        return renewed

    async def release_lease(self, lease: Lease) -> None:
        await self.inner.release_lease(lease)

    async def list_threads(self, *, prefix: str = "", limit: int | None = None) -> list[str]:
        return list(await self.inner.list_threads(prefix=prefix, limit=limit))

    async def set_thread_ttl(self, thread_id: str, seconds: float | None) -> bool:
        return bool(await self.inner.set_thread_ttl(thread_id, seconds))

    async def sweep_expired(self) -> list[str]:
        return list(await self.inner.sweep_expired())

    async def delete_thread(self, thread_id: str) -> bool:
        return bool(await self.inner.delete_thread(thread_id))

    async def erase_thread(self, thread_id: str) -> bool:
        return await erase_thread(self.inner, thread_id)

    async def rotate_thread(self, thread_id: str, *, lease: Lease | None = None) -> int:
        """Rewrite the thread under the first key, in one write (a compaction of the whole
        live log, whose old ciphertexts go to the archive); returns the new version."""
        record = await self.load_thread(thread_id)
        change = ThreadWrite(
            compaction=Compaction(0, len(record.messages), tuple(record.messages)),
            checkpoint=record.checkpoint,
            state=record.state if record.state is not None else Unchanged(),
        )
        return await self.write(thread_id, change, expected_version=record.version, lease=lease)

    async def aclose(self) -> None:
        await self.inner.aclose()
