"""The proxy path's HTTP/1.1 client: keep-alive connections to backends, parsed by httptools.

aiohttp cost about 70 us of CPU per proxied request, a quarter of the whole path
(py-spy, see bench/results/overhead.md); this client does only what a proxy needs:
send bytes the gateway already holds, hand back the status and raw headers as soon
as they arrive, then body chunks as they come, with backpressure. Waits are bounded
by timers on the event loop rather than by timeout context managers.

The rule that keeps one client's answer from reaching another: a connection goes
back to the pool only when exactly one complete final response was read on it and
nothing else arrived. Interim (1xx) responses are skipped; bytes after the final
response, or on an idle pooled connection, close the connection. Trailers are read
and dropped. Header sizes and counts are bounded, and so is a body the caller wants
whole.

A request that fails before any response byte on a reused connection (the backend
closed it while idle) is sent once more, on a fresh connection.
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

# Idle connections to backends are dropped after this: before the backends' own
# servers close them (uvicorn's and so vLLM's default keep-alive: 5 s), since a
# server closing one as a request goes out on it resets that request.
UPSTREAM_KEEPALIVE = 4.0
HIGH_WATER = 256 * 1024  # buffered body bytes at which reading from the backend pauses


class UpstreamError(Exception):
    """The backend could not be reached, or broke the exchange.

    `reason` is one of "connect", "broken", "headers_too_large", "body_too_large",
    "stalled".
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ResponseLimits:
    """What the gateway accepts from a backend."""

    max_headers: int = 100  # header lines, interim responses and trailers included
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 64 * 1024 * 1024  # for bodies read whole (`read`)


@dataclass(frozen=True)
class Target:
    """Where a backend's base URL points."""

    host: str
    port: int
    tls: bool
    authority: bytes  # the Host header: host and explicit port, never userinfo
    prefix: str  # the URL's path, before the request's own

    @classmethod
    def parse(cls, url: str) -> Target:
        u = urlsplit(url)
        tls = u.scheme == "https"
        host = u.hostname or ""
        port = u.port or (443 if tls else 80)
        shown = f"[{host}]" if ":" in host else host
        authority = f"{shown}:{u.port}" if u.port is not None else shown
        return cls(host, port, tls, authority.encode("idna"), u.path.rstrip("/"))


class _Oversize(Exception):
    """Raised inside a parser callback to stop parsing (httptools re-raises it wrapped
    in an HttpParserCallbackError)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; httptools calls the `on_*` methods as bytes arrive."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: ResponseLimits) -> None:
        self.loop = loop
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.framed = False  # content-length or chunked: the end is known without EOF
        self.interim = False  # inside a 1xx response
        self.headers_done = False  # of the final response
        self.complete = False  # the final response has ended
        self.keep_alive = True
        self.received_any = False
        self.error: UpstreamError | None = None
        self.header_lines = 0
        self.header_bytes = 0
        self.body_limit: int | None = None
        self.body_bytes = 0
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP (or TLS) transport

    def data_received(self, data: bytes) -> None:
        if self.complete or self.error is not None:
            # After the final response (or on an idle pooled connection) nothing may
            # arrive: it would become somebody else's answer.
            self._poison()
            return
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.fail(UpstreamError("broken"))  # 101: the gateway never asks to upgrade
        except httptools.HttpParserError:
            # A callback's _Oversize arrives here too, wrapped.
            if self.error is not None:
                self.fail(self.error)
            elif self.complete:
                self._poison()  # bytes after a complete answer: the answer stands
            else:
                self.fail(UpstreamError("broken"))
        if self.complete and not self.keep_alive and self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.framed and not self.complete and exc is None:
            self.complete = True  # a body delimited by the end of the connection
            self.keep_alive = False
        elif not self.complete and self.error is None:
            self.error = UpstreamError("broken")
        self._wake()

    def _poison(self) -> None:
        self.keep_alive = False
        if self.transport is not None:
            self.transport.close()

    def fail(self, error: UpstreamError) -> None:
        """End the exchange with `error`; the connection is closed."""
        if self.error is None and not self.complete:
            self.error = error
        self._poison()
        self._wake()

    # -- httptools callbacks --------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.headers_done:
            # A second final response on one request: never read it, never reuse.
            self.keep_alive = False
            raise _Oversize
        self.headers = []

    def _count(self, size: int) -> None:
        self.header_lines += 1
        self.header_bytes += size
        lim = self.limits
        if self.header_lines > lim.max_headers or self.header_bytes > lim.max_header_bytes:
            self.error = UpstreamError("headers_too_large")
            raise _Oversize

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        if self.headers_done or self.interim:
            return  # trailers, or an interim response's headers: not relayed
        self.headers.append((name, value))
        lower = name.lower()
        if lower == b"content-length" or lower == b"transfer-encoding":
            self.framed = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            self.interim = True  # 100 Continue, 103 Early Hints: wait for the real one
            self.headers = []
            self.framed = False
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_limit is not None and self.body_bytes > self.body_limit:
            self.error = UpstreamError("body_too_large")
            raise _Oversize
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
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


class Attempt:
    """A handle on one request in flight, so that someone else can abort it (the
    monitor does, when the backend has stalled)."""

    __slots__ = ("conn", "started", "stream")

    def __init__(self, started: float, stream: bool) -> None:
        self.started = started
        self.stream = stream
        self.conn: _Connection | None = None

    def abort(self, reason: str) -> None:
        if self.conn is not None:
            self.conn.fail(UpstreamError(reason))


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
            if c.error is not None:
                raise c.error
            if c.complete:
                return b""
            await c.wait(timeout)
        return c.take()

    async def read(self, timeout: float) -> bytes:
        """The rest of the body, at most the limit's `max_body_bytes` (else
        UpstreamError "body_too_large"); `timeout` bounds each wait for more bytes."""
        c = self._conn
        c.body_limit = c.limits.max_body_bytes
        if c.body_bytes > c.body_limit:
            c.fail(UpstreamError("body_too_large"))
        parts = []
        while True:
            if c.error is not None:
                raise c.error
            if c.chunks:
                parts.append(c.take())
            if c.complete:
                return b"".join(parts)
            await c.wait(timeout)

    def ended(self) -> bool:
        """The whole body has arrived and been taken."""
        return self._conn.complete and not self._conn.chunks

    def release(self) -> None:
        """Done with it: the connection goes back to the pool if exactly one complete
        response was read and nothing else arrived; otherwise it is closed."""
        if self._done:
            return
        self._done = True
        c = self._conn
        if c.complete and not c.chunks and c.keep_alive and c.error is None and not c.closed:
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
        self,
        connect_timeout: float,
        keepalive: float = UPSTREAM_KEEPALIVE,
        max_idle_per_host: int = 512,
        limits: ResponseLimits | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.max_idle = max_idle_per_host
        self.limits = limits or ResponseLimits()
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
        attempt: Attempt | None = None,
    ) -> UpstreamResponse:
        """Send one request; return once the final status and headers are in.

        Raises UpstreamError and TimeoutError (no headers within `timeout` seconds).
        `attempt`, when given, is pointed at the connection, so that it can be aborted.
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
        fresh = False
        while True:
            conn, reused = await self._get(key, target, fresh)
            if attempt is not None:
                attempt.conn = conn
            conn.transport.write(request)  # type: ignore[union-attr]
            try:
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(timeout)
            except UpstreamError:
                conn._poison()
                error = conn.error
                if reused and not conn.received_any and error and error.reason == "broken":
                    # The backend had closed the idle connection, and likely every
                    # other one it had with us: go again on a new one.
                    self._drop_idle(key)
                    fresh = True
                    continue
                raise
            except BaseException:
                conn._poison()
                raise
            return UpstreamResponse(conn.status, conn.headers, conn, self, key)

    async def _get(
        self, key: tuple[str, int, bool], target: Target, fresh: bool
    ) -> tuple[_Connection, bool]:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle and not fresh:
            conn = idle.pop()
            if conn.closed or now - conn.idle_since > self.keepalive:
                conn._poison()
                continue
            conn._reset()
            return conn, True
        loop = asyncio.get_running_loop()
        context = None
        if target.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        limits = self.limits
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop, limits),
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
            conn._poison()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def _drop_idle(self, key: tuple[str, int, bool]) -> None:
        for conn in self._idle.pop(key, []):
            conn._poison()

    def idle_count(self, target: Target) -> int:
        """Pooled connections to `target` (for tests and the admin view)."""
        return len(self._idle.get((target.host, target.port, target.tls), []))

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn._poison()
        self._idle.clear()
