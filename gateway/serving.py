"""Run one or more ASGI apps with uvicorn in one event loop, stopped together by a signal."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from pydantic import SecretStr

from gateway.client_protocol import ClientLimits, limited_protocol


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
    sock: socket.socket | None = None  # an already listening socket (shared by processes)
    limits: ClientLimits = field(default_factory=ClientLimits)


def make_server(
    listener: Listener, log_level: str = "warning", graceful_seconds: int = 5
) -> uvicorn.Server:
    limits = listener.limits
    # httptools gets every limit (see client_protocol); h11 bounds the head's size.
    http: Any = limited_protocol(limits) if listener.http == "httptools" else listener.http
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
        http=http,
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_keep_alive=limits.keepalive_seconds,  # type: ignore[arg-type]  # a float works
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
    serving = zip(servers, listeners, strict=True)
    await asyncio.gather(*(s.serve(sockets=[lst.sock] if lst.sock else None) for s, lst in serving))


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


class PortInUse(OSError):
    """A port that something else is listening on."""


def check_ports(host: str, ports: Sequence[int]) -> None:
    """Raise PortInUse naming the first of `ports` on `host` that cannot be bound, before
    anything starts (a server that fails to bind later takes the others down with it)."""
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror}") from exc


def gateway_listener(app: Any, settings: Any, sock: socket.socket | None = None) -> Listener:
    """A listener for the gateway `app`, with the settings' limits on clients."""
    limits = ClientLimits(
        settings.limits.request_headers,
        settings.limits.request_header_bytes,
        settings.timeouts.client_header,
        settings.timeouts.client_keepalive,
    )
    return Listener(app, settings.host, settings.port, settings.http_parser, sock, limits)


def serve_processes(make_app: Callable[[Any], Any], settings: Any, processes: int) -> None:
    """`processes` gateway processes accepting on one listening socket, each a replica
    of its own, sharing the store (an embedded one is started here for all of them)."""
    from gateway.store import EmbeddedStore

    store = None
    if settings.redis_url is None:
        store = EmbeddedStore()
        store.start()
        settings = settings.model_copy(update={"redis_url": SecretStr(store.url)})
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.listen(2048)
    children = []
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:  # a replica: its own app, loop and replica id
            listener = gateway_listener(make_app(settings), settings, sock)
            run(serve_apps([listener]), settings.event_loop)
            os._exit(0)
        children.append(pid)

    def forward(signum: int, _frame: Any) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        for child in children:
            os.waitpid(child, 0)
    finally:
        sock.close()
        if store is not None:
            store.stop()
