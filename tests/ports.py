"""Loopback ports for test servers that must come back on the same port.

A port picked by binding to 0 is in the kernel's ephemeral range, so once it is closed
any other xdist worker's server (or client socket) can be handed the same port before a
restarted server binds it again. These ports come from below the ephemeral range, in a
block of their own per xdist worker, so only the test that reserved one ever binds it.
"""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

__all__ = ["reserved_port"]

BLOCK = 200
FLOOR = 10_000


def _ephemeral_floor() -> int:
    try:
        low = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
        return int(low)
    except (OSError, IndexError, ValueError):
        return 32_768  # Linux's default; the IANA range starts higher still


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = worker.removeprefix("gw")
    return int(digits) if digits.isdigit() else 0


def _candidates() -> itertools.count[int]:
    start = FLOOR + _worker_index() * BLOCK
    if start + BLOCK > _ephemeral_floor():
        raise RuntimeError(
            f"xdist worker {_worker_index()} has no port block below the ephemeral range"
        )
    return itertools.count(start)


_next = _candidates()
_end = FLOOR + (_worker_index() + 1) * BLOCK


def reserved_port() -> int:
    """A port of this worker's block that nothing listens on now."""
    for port in _next:
        if port >= _end:
            break
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("this xdist worker's block of test ports is used up")
