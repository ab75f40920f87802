"""A raw-socket HTTP/1.1 backend that breaks the protocol on cue.

Each request it reads is answered by a `Play`: the exact bytes to send, how to cut
them into writes, and what to do after. Bodies carry the request's `seed` so that a
client can tell its own answer from anybody else's.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from tests.support import loopback_socket


@dataclass
class Play:
    """How to answer one request."""

    data: bytes
    split: int = 0  # write in pieces of this many bytes (0: at once)
    close: bool = False  # close the connection after writing
    hold: float = 0.0  # seconds to wait before answering
    late: bytes = b""  # written once the client has gone idle on the connection
    late_after: float = 0.05


def read_head_and_body(buf: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(head, body, rest) when `buf` holds one whole request, else None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end]
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    body_end = end + 4 + length
    if len(buf) < body_end:
        return None
    return head, buf[end + 4 : body_end], buf[body_end:]


def seed_of(body: bytes) -> int:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return -1
    seed = data.get("seed") if isinstance(data, dict) else None
    return seed if isinstance(seed, int) else -1


def completion(seed: int, extra: str = "") -> bytes:
    """A chat completion whose content names `seed`."""
    return orjson.dumps(
        {
            "id": f"cmpl-{seed}",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"seed={seed}{extra}"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


def stream_events(seed: int, n: int = 3) -> list[bytes]:
    """SSE events of a streamed chat completion naming `seed`, [DONE] last."""
    out = []
    for i in range(n):
        chunk = {
            "id": f"cmpl-{seed}",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": f"seed={seed};{i} "}}],
        }
        out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def response(status: int, body: bytes, *headers: bytes, reason: bytes = b"OK") -> bytes:
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        status,
        reason,
        len(body),
    )
    return head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


def chunked(status: int, parts: list[bytes], trailers: bytes = b"", ext: bytes = b"") -> bytes:
    out = [b"HTTP/1.1 %d OK\r\ncontent-type: text/event-stream\r\n" % status]
    out.append(b"transfer-encoding: chunked\r\n\r\n")
    for p in parts:
        out.append(b"%x%s\r\n%s\r\n" % (len(p), ext, p))
    out.append(b"0\r\n" + trailers + b"\r\n")
    return b"".join(out)


Script = Callable[[bytes, bytes, int], Play]  # (head, body, n-th request) -> Play


class HostileBackend:
    """Serves on loopback in a thread of its own; `script` decides every answer."""

    def __init__(self, script: Script, drop_reused: bool = False) -> None:
        """`drop_reused`: a second request on a connection is met with a close, as from
        a server whose keep-alive timeout fired just as the request was sent."""
        self.script = script
        self.drop_reused = drop_reused
        self._sock = loopback_socket()
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[bytes] = []  # heads, in arrival order
        self.connections = 0
        self._count = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, sock=self._sock)
        )
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        buf = b""
        served = 0
        try:
            while True:
                parsed = read_head_and_body(buf)
                while parsed is None:
                    data = await reader.read(65536)
                    if not data:
                        return
                    buf += data
                    parsed = read_head_and_body(buf)
                head, body, buf = parsed
                if served and self.drop_reused:
                    return
                served += 1
                self.requests.append(head)
                n = self._count
                self._count += 1
                play = self.script(head, body, n)
                if play.hold:
                    await asyncio.sleep(play.hold)
                if play.split:
                    for i in range(0, len(play.data), play.split):
                        writer.write(play.data[i : i + play.split])
                        await writer.drain()
                else:
                    writer.write(play.data)
                    await writer.drain()
                if play.late:
                    await asyncio.sleep(play.late_after)
                    writer.write(play.late)
                    await writer.drain()
                if play.close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def close(self) -> None:
        def stop() -> None:
            self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(5)
