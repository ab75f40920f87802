"""The client-facing HTTP/1.1 protocol: uvicorn's httptools protocol, with limits.

uvicorn (0.54) buffers request headers of any size and keeps a connection that never
sends a request open for ever. This protocol bounds the request head (lines and
bytes, with a 431 in OpenAI's shape) and the time it may take to arrive: a
connection must deliver a complete head within `header_seconds` of opening, or of
the first byte of each later request. Idle keep-alive connections are closed by
uvicorn's own `timeout_keep_alive`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True)
class ClientLimits:
    max_headers: int = 100
    max_header_bytes: int = 32 * 1024  # the request line and every header line
    header_seconds: float = 10.0
    keepalive_seconds: float = 5.0


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
        _head_timer: asyncio.TimerHandle | None = None
        _head_lines = 0
        _head_bytes = 0
        _too_large = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(limits.header_seconds, self._expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expired(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

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
            self._arm()

        def _count(self, size: int, line: int) -> None:
            self._head_lines += line
            self._head_bytes += size
            if self._head_lines > limits.max_headers or self._head_bytes > limits.max_header_bytes:
                self._too_large = True
                raise _HeadTooLarge

        def on_url(self, url: bytes) -> None:
            self._count(len(url), 0)
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4, 1)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

    return LimitedProtocol
