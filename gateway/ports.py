"""Loopback ports that are free at the moment of asking."""

from __future__ import annotations

import socket

__all__ = ["free_ports"]


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free now. All are bound before any is released,
    so one call never hands out the same port twice; the OS does not hand a released
    port out again at once, so the caller can bind each shortly after."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
