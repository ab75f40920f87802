"""Loopback ports that are free at the moment of asking."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_ports"]

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL = (32768, 60999)  # the kernel's default, where the file cannot be read
LOWEST = 10000  # below this, ports well-known services listen on


def ephemeral_range(source: Path = EPHEMERAL) -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (and `bind(0)`), inclusive."""
    try:
        low, high = (int(x) for x in source.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return low, high


def free_ports(count: int, ephemeral: tuple[int, int] | None = None) -> list[int]:
    """`count` distinct loopback ports free now, for servers started next.

    They are drawn below the kernel's ephemeral range: a port found free there stays
    free until its server binds it, where in the range any outgoing connection (of
    this process or another) can take it as its local end in between. All are bound
    before any is released, so one call never hands out the same port twice. Where
    the range leaves too little room below it, the kernel picks (`bind(0)`)."""
    low, _ = ephemeral or ephemeral_range()
    pool = range(LOWEST, low)
    socks: list[socket.socket] = []
    try:
        if len(pool) < 1000:
            for _ in range(count):
                socks.append(_bound(0))
        else:
            # From a random point on (a fresh generator: a caller's global seed must not
            # pick ports), round the whole pool if need be.
            start = random.Random().randrange(len(pool))
            for i in range(len(pool)):
                if len(socks) == count:
                    break
                try:
                    socks.append(_bound(pool[(start + i) % len(pool)]))
                except OSError:
                    continue
        if len(socks) < count:
            raise OSError(f"fewer than {count} free loopback ports in {pool}")
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _bound(port: int) -> socket.socket:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        raise
    return s
