"""A backend that costs almost nothing, for measuring what the gateway adds.

An asyncio protocol speaking just enough HTTP/1.1 keep-alive: `POST
/v1/chat/completions` and `/v1/completions` answer at once with `max_tokens` tokens
(default 16), as one JSON body or as SSE chunks; `GET /v1/models`, `/health` and a
vLLM-style `/metrics` let the gateway discover and scrape it. It runs on uvloop when
installed: `python -m bench.fast_backend --port 8101 --model instant`.

With `--hold-ms`, each completion is answered that long after it arrived, and
`/metrics` reports the ones held: the first `--batch` as running, the rest as waiting,
as an engine with a full batch would. That keeps the gateway's queues full.
"""

from __future__ import annotations

import argparse
import asyncio
import re

import orjson

_MAX_TOKENS = re.compile(rb'"max_(?:completion_)?tokens"\s*:\s*(\d+)')
_STREAM = re.compile(rb'"stream"\s*:\s*true')


def _response(status: str, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 "
        + status.encode()
        + b"\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def _content_length(head: bytes) -> int:
    i = head.find(b"content-length:")
    if i < 0:
        return 0
    j = head.find(b"\r\n", i)
    return int(head[i + 15 : j if j >= 0 else len(head)])


class Held:
    """Completions answered late, shared by every connection of one backend."""

    def __init__(self, seconds: float, batch: int) -> None:
        self.seconds = seconds
        self.batch = batch
        self.count = 0

    def metrics(self) -> bytes:
        running = min(self.count, self.batch)
        return (
            b"vllm:num_requests_running %d\nvllm:num_requests_waiting %d\n"
            b"vllm:kv_cache_usage_perc %.3f\n" % (running, self.count - running, running / 10)
        )


class Backend(asyncio.Protocol):
    def __init__(self, models: list[str], held: Held | None = None) -> None:
        self.models = models
        self.model = models[0]
        self.held = held or Held(0.0, 5)
        self.buffer = b""
        self.transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport writes

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = _content_length(head)
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            assert self.transport is not None
            path = head.split(b" ", 2)[1]
            if self.held.seconds and path in (b"/v1/chat/completions", b"/v1/completions"):
                # One request at a time per connection (no pipelining), so answers keep
                # their order.
                self.held.count += 1
                asyncio.get_running_loop().call_later(
                    self.held.seconds, self.release, self.answer(path, body)
                )
            else:
                self.transport.write(self.answer(path, body))

    def release(self, answer: bytes) -> None:
        self.held.count -= 1
        assert self.transport is not None
        if not self.transport.is_closing():
            self.transport.write(answer)

    def answer(self, path: bytes, body: bytes) -> bytes:
        if path in (b"/v1/chat/completions", b"/v1/completions"):
            found = _MAX_TOKENS.search(body)
            tokens = int(found.group(1)) if found else 16
            chat = path == b"/v1/chat/completions"
            if _STREAM.search(body):
                return self.stream(tokens, chat)
            text = "tok " * tokens
            choice = {"index": 0, "finish_reason": "length"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            return _response(
                "200 OK",
                orjson.dumps(
                    {
                        "id": "fast",
                        "object": "chat.completion" if chat else "text_completion",
                        "created": 0,
                        "model": self.model,
                        "choices": [choice],
                        "usage": {
                            "prompt_tokens": 4,
                            "completion_tokens": tokens,
                            "total_tokens": tokens + 4,
                        },
                    }
                ),
            )
        if path == b"/v1/models":
            data = [{"id": m, "object": "model"} for m in self.models]
            return _response("200 OK", orjson.dumps({"object": "list", "data": data}))
        if path == b"/health":
            return _response("200 OK", b"{}")
        if path == b"/metrics":
            return _response("200 OK", self.held.metrics(), b"text/plain")
        return _response("404 Not Found", b'{"error":{"message":"not found"}}')

    def stream(self, tokens: int, chat: bool) -> bytes:
        chunks = []
        for _ in range(tokens):
            delta = {"delta": {"content": "tok "}} if chat else {"text": "tok "}
            event = orjson.dumps(
                {"id": "fast", "model": self.model, "choices": [{"index": 0, **delta}]}
            )
            chunks.append(b"data: " + event + b"\n\n")
        chunks.append(b"data: [DONE]\n\n")
        body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
        return (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + body
        )


async def serve(host: str, port: int, models: list[str], held: Held) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Backend(models, held), host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8101)
    p.add_argument("--model", default="instant", help="model names it serves, comma-separated")
    p.add_argument("--hold-ms", type=float, default=0.0, help="answer completions this late")
    p.add_argument("--batch", type=int, default=5, help="held requests reported as running")
    a = p.parse_args()
    from gateway.serving import run

    run(serve(a.host, a.port, a.model.split(","), Held(a.hold_ms / 1000.0, a.batch)))


if __name__ == "__main__":
    main()
