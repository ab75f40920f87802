"""The proxy path's HTTP/1.1 client: keep-alive connections to backends, parsed by httptools.

aiohttp cost about 70 us of CPU per proxied request, a quarter of the whole path
(py-spy, see bench/results/overhead.md); this client does only what a proxy needs:
send bytes the gateway already holds, hand back the status and raw headers as soon
as they arrive, then body chunks as they come, with backpressure. Waits are bounded
by timers on the event loop rather than by timeout context managers.

A request that fails before any response byte on a reused connection (the backend
closed it while idle) is sent once more on a fresh connection.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 256 * 1024  # buffered body bytes at which reading from the backend pauses


class UpstreamError(Exception):
    """The backend could not be reached, or broke the exchange."""

    def __init__(self, reason: str) -> None:  # "connect" or "broken"
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Target:
    """Where a backend's base URL points."""

    host: str
    port: int
    tls: bool
    authority: bytes  # the Host header
    prefix: str  # the URL's path, before the request's own

    @classmethod
    def parse(cls, url: str) -> Target:
        u = urlsplit(url)
        tls = u.scheme == "https"
        port = u.port or (443 if tls else 80)
        return cls(u.hostname or "", port, tls, u.netloc.encode("latin-1"), u.path.rstrip("/"))


class _Connection(asyncio.Protocol):
    """One keep-alive connection; httptools calls the `on_*` methods as bytes arrive."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.framed = False  # content-length or chunked: the end is known without EOF
        self.headers_done = False
        self.complete = False
        self.keep_alive = True
        self.received_any = False
        self.error: UpstreamError | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP (or TLS) transport

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.error = UpstreamError("broken")
            self.keep_alive = False
            if self.transport is not None:
                self.transport.close()
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.framed and not self.complete and exc is None:
            self.complete = True  # a body delimited by the end of the connection
        elif not self.complete and self.error is None:
            self.error = UpstreamError("broken")
        self._wake()

    # -- httptools callbacks --------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        lower = name.lower()
        if lower == b"content-length" or lower == b"transfer-encoding":
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- used by UpstreamResponse ---------------------------------------------------

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until the parser reports progress; TimeoutError after `timeout` seconds."""
        waiter = self.waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    def take(self) -> bytes:
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        if len(self.chunks) != 0:
            self.chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


@dataclass
class UpstreamResponse:
    """A backend's answer: status and raw headers now, the body as it comes."""

    status: int
    raw_headers: list[tuple[bytes, bytes]]
    _conn: _Connection
    _pool: UpstreamPool
    _key: tuple[str, int, bool]
    _done: bool = field(default=False)

    async def readany(self, timeout: float) -> bytes:
        """The body bytes received since the last call, waiting up to `timeout` seconds
        for some; b"" once the body has ended."""
        c = self._conn
        while not c.chunks:
            if c.complete:
                return b""
            if c.error is not None:
                raise c.error
            await c.wait(timeout)
        return c.take()

    async def read(self, timeout: float) -> bytes:
        """The rest of the body; `timeout` bounds each wait for more bytes."""
        c = self._conn
        parts = []
        while True:
            if c.chunks:
                parts.append(c.take())
            if c.complete:
                return b"".join(parts)
            if c.error is not None:
                raise c.error
            await c.wait(timeout)

    def ended(self) -> bool:
        """The whole body has arrived and been taken."""
        return self._conn.complete and not self._conn.chunks

    def release(self) -> None:
        """Done with it: the connection goes back to the pool if the exchange ended
        cleanly, else it is closed."""
        if self._done:
            return
        self._done = True
        c = self._conn
        if c.complete and c.keep_alive and c.error is None and not c.closed:
            self._pool._put(self._key, c)
        elif c.transport is not None:
            c.transport.close()

    def close(self) -> None:
        """Abandon the exchange; the backend sees the connection close."""
        if self._done:
            return
        self._done = True
        if self._conn.transport is not None:
            self._conn.transport.close()


class UpstreamPool:
    """Keep-alive connections per backend address."""

    def __init__(
        self, connect_timeout: float, keepalive: float = 30.0, max_idle_per_host: int = 512
    ) -> None:
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.max_idle = max_idle_per_host
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def send(
        self,
        target: Target,
        method: bytes,
        path: str,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
        timeout: float,
    ) -> UpstreamResponse:
        """Send one request; return once the status and headers are in.

        Raises UpstreamError ("connect" or "broken") and TimeoutError (no headers
        within `timeout` seconds).
        """
        head = [
            method,
            b" ",
            (target.prefix + path).encode("latin-1"),
            b" HTTP/1.1\r\nhost: ",
            target.authority,
            b"\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\n",
        ]
        for k, v in headers:
            head += (k, b": ", v, b"\r\n")
        head.append(b"\r\n")
        request = b"".join(head) + body
        key = (target.host, target.port, target.tls)
        for attempt in (0, 1):
            conn, reused = await self._get(key, target)
            conn.transport.write(request)  # type: ignore[union-attr]
            try:
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(timeout)
            except UpstreamError:
                if conn.transport is not None:
                    conn.transport.close()
                if reused and attempt == 0 and not conn.received_any:
                    continue  # the backend had closed the idle connection
                raise
            except BaseException:
                if conn.transport is not None:
                    conn.transport.close()
                raise
            return UpstreamResponse(conn.status, conn.headers, conn, self, key)
        raise AssertionError("unreachable")

    async def _get(self, key: tuple[str, int, bool], target: Target) -> tuple[_Connection, bool]:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.closed or now - conn.idle_since > self.keepalive:
                if conn.transport is not None:
                    conn.transport.close()
                continue
            conn._reset()
            return conn, True
        loop = asyncio.get_running_loop()
        context = None
        if target.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop),
                    target.host,
                    target.port,
                    ssl=context,
                    server_hostname=target.host if context else None,
                ),
                self.connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise UpstreamError("connect") from exc
        return conn, False

    def _put(self, key: tuple[str, int, bool], conn: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self.max_idle:
            if conn.transport is not None:
                conn.transport.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()
