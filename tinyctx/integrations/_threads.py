"""Reading and writing a whole tinyctx thread, for importing a framework's history.

:func:`write_thread` makes a thread hold exactly the given messages in one write: appended
to an empty thread, or replacing a thread's messages as one compaction (the store archives
what was there), at the version it read (a concurrent write makes it
:class:`~tinyctx.threads.StaleThreadVersion`, nothing lost).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..codec import decode_messages, encode_message
from ..messages import Message, check_pairing
from ..threads import Compaction, ThreadStore, ThreadWrite

__all__ = ["read_thread", "write_thread"]


async def read_thread(store: ThreadStore, thread_id: str) -> tuple[Message, ...]:
    """The messages of ``thread_id`` (none for a thread never written)."""
    record = await store.load_thread(thread_id)
    return decode_messages(record.messages)


async def write_thread(store: ThreadStore, thread_id: str, messages: Sequence[Message]) -> int:
    """Make ``thread_id`` hold ``messages`` (pairing checked first); returns its version."""
    history = tuple(messages)
    check_pairing(history)
    record = await store.load_thread(thread_id)
    documents = tuple(encode_message(m) for m in history)
    if record.messages:
        change = ThreadWrite(compaction=Compaction(0, len(record.messages), documents))
    else:
        change = ThreadWrite(append=documents)
    return await store.write(thread_id, change, expected_version=record.version)
