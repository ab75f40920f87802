"""The client-facing HTTP/1.1 protocol: uvicorn's httptools protocol, with limits and
a disconnect notice.

uvicorn (0.54) buffers request headers of any size and keeps a connection that never
sends a request open for ever. This protocol bounds the request head (lines and
bytes, with a 431 in OpenAI's shape) and the time it may take to arrive: a
connection must deliver a complete head within `header_seconds` of opening, or of
the first byte of each later request. Idle keep-alive connections are closed by
uvicorn's own `timeout_keep_alive`.

A proxy must stop its upstream request when the client leaves (see
`gateway.relay.ClientWatch`). ASGI offers only a task waiting on `receive()` for
that; this protocol also puts a hook in each request's scope
(`relay.DISCONNECT_HOOK`) through which the request registers a callback that the
protocol calls if the connection is lost before the response is complete: no task
per request. Written against uvicorn 0.54's HttpToolsProtocol
(tests/gateway/test_data_plane.py checks the limits and tests/gateway/test_proxy.py
the disconnect notice, through a real server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.relay import DISCONNECT_HOOK


@dataclass(frozen=True)
class ClientLimits:
    max_headers: int = 100
    max_header_bytes: int = 32 * 1024  # the request line and every header line
    header_seconds: float = 10.0
    keepalive_seconds: float = 75.0  # longer than its clients keep idle connections


def _too_large_response(limits: ClientLimits) -> bytes:
    body = orjson.dumps(
        {
            "error": {
                "message": f"request headers exceed the gateway's limits ({limits.max_headers} "
                f"lines, {limits.max_header_bytes} bytes)",
                "type": "invalid_request_error",
                "param": None,
                "code": "request_header_fields_too_large",
            }
        }
    )
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )


class _HeadTooLarge(Exception):
    pass


def limited_protocol(limits: ClientLimits) -> type[HttpToolsProtocol]:
    """An httptools protocol class for uvicorn's `http` setting, holding `limits`."""
    rejection = _too_large_response(limits)

    class LimitedProtocol(HttpToolsProtocol):
        # One timer per connection, re-armed while the connection lives: a timer per
        # request would cost more than the check. A head in progress longer than
        # `header_seconds` when it fires closes the connection.
        _head_timer: asyncio.TimerHandle | None = None
        _head_started: float | None = None
        _head_lines = 0
        _head_bytes = 0
        _too_large = False
        _on_lost: Callable[[], None] | None = None  # the running request's, if it asked

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._head_started = self.loop.time()
            self._head_timer = self.loop.call_later(limits.header_seconds, self._check)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)
            on_lost, self._on_lost = self._on_lost, None
            if on_lost is not None:
                on_lost()

        def _check(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            started = self._head_started
            now = self.loop.time()
            if started is not None and now - started >= limits.header_seconds:
                self.transport.close()
                return
            wait = limits.header_seconds - (now - started if started is not None else 0.0)
            self._head_timer = self.loop.call_later(wait, self._check)

        def data_received(self, data: bytes) -> None:
            if self._too_large:
                return
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
            except httptools.HttpParserError:
                if self._too_large:
                    self.transport.write(rejection)
                    self.transport.close()
                else:
                    msg = "Invalid HTTP request received."
                    self.logger.warning(msg)
                    self.send_400_response(msg)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_lines = 0
            self._head_bytes = 0
            self._head_started = self.loop.time()

        # uvicorn's own on_url and on_header, with the count in the same call.
        def on_url(self, url: bytes) -> None:
            self._head_bytes += len(url)
            if self._head_bytes > limits.max_header_bytes:
                self._too_large = True
                raise _HeadTooLarge
            self.url += url

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_lines += 1
            self._head_bytes += len(name) + len(value) + 4
            if self._head_lines > limits.max_headers or self._head_bytes > limits.max_header_bytes:
                self._too_large = True
                raise _HeadTooLarge
            name = name.lower()
            if name == b"expect" and value.lower() == b"100-continue":
                self.expect_100_continue = True
            self.headers.append((name, value))

        def on_headers_complete(self) -> None:
            self._head_started = None
            super().on_headers_complete()
            self.scope[DISCONNECT_HOOK] = self._notify_on_loss  # type: ignore[literal-required]

        def _notify_on_loss(self, callback: Callable[[], None]) -> None:
            self._on_lost = callback
            # A large upload can leave reading paused; the loss is seen only when reading.
            self.flow.resume_reading()

        def on_response_complete(self) -> None:
            self._on_lost = None
            super().on_response_complete()

    return LimitedProtocol
