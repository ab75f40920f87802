"""Run one or more ASGI apps with uvicorn in one event loop, stopped together by a signal."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    # Several servers share one loop, so signals are handled once, by serve_apps.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@dataclass(frozen=True)
class Listener:
    app: Any
    host: str
    port: int
    http: str = "httptools"  # uvicorn's HTTP implementation: httptools or h11


def make_server(
    listener: Listener, log_level: str = "warning", graceful_seconds: int = 5
) -> uvicorn.Server:
    config = uvicorn.Config(
        listener.app,
        host=listener.host,
        port=listener.port,
        log_level=log_level,
        access_log=False,
        # No client addresses are used, so X-Forwarded-For is not parsed per request.
        proxy_headers=False,
        server_header=False,
        loop="none",
        http=listener.http,
        lifespan="on",
        timeout_graceful_shutdown=graceful_seconds,
    )
    return _Server(config)


async def serve_apps(listeners: Sequence[Listener], log_level: str = "warning") -> None:
    servers = [make_server(lst, log_level) for lst in listeners]
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for s in servers:
            s.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop)
    await asyncio.gather(*(s.serve() for s in servers))


def run(coro: Any, loop: str = "uvloop") -> None:
    """Run on uvloop when it is installed (and `loop` asks for it), else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        loop = "asyncio"
    if loop == "uvloop":
        uvloop.run(coro)
    else:
        asyncio.run(coro)
