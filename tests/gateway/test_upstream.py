"""The proxy path's HTTP client against a real server on loopback that misbehaves on cue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.upstream import Target, UpstreamError, UpstreamPool
from tests.support import closed_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Target]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> Target:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return Target.parse(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")

    yield start
    for s in servers:
        s.close()


async def test_keep_alive_reuses_one_connection_and_reads_large_bodies(
    serve: Callable[[Handler], Awaitable[Target]],
) -> None:
    connections = 0
    big = b"x" * (3 * 1024 * 1024)  # well over the pause threshold

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(big) + big)
            await writer.drain()

    target = await serve(handler)
    pool = UpstreamPool(connect_timeout=1.0)
    for _ in range(3):
        r = await pool.send(target, b"POST", "/v1/x", [(b"x-a", b"1")], b"{}", 5.0)
        assert r.status == 200 and await r.read(5.0) == big
        r.release()
    assert connections == 1
    pool.close()


async def test_chunked_streams_arrive_chunk_by_chunk_and_end(
    serve: Callable[[Handler], Awaitable[Target]],
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for part in (b"data: 1\n\n", b"data: 2\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    pool = UpstreamPool(connect_timeout=1.0)
    r = await pool.send(await serve(handler), b"POST", "/", [], b"{}", 5.0)
    assert await r.readany(5.0) == b"data: 1\n\n"
    assert not r.ended()
    assert await r.readany(5.0) == b"data: 2\n\n"
    assert await r.readany(5.0) == b"" and r.ended()
    r.release()
    pool.close()


async def test_a_connection_the_server_closed_while_idle_is_replaced(
    serve: Callable[[Handler], Awaitable[Target]],
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # one request per connection, without saying so

    target = await serve(handler)
    pool = UpstreamPool(connect_timeout=1.0)
    for i in range(20):
        # Straight after the answer the close is often not seen yet: the connection is
        # reused, the send fails with no byte back, and goes again on a new one.
        r = await pool.send(target, b"POST", "/", [], b"{}", 5.0)
        assert await r.read(5.0) == b"ok"
        r.release()
        if i % 2:
            await asyncio.sleep(0.02)  # and sometimes the close is seen first
    pool.close()


async def test_failures_are_told_apart(serve: Callable[[Handler], Awaitable[Target]]) -> None:
    pool = UpstreamPool(connect_timeout=1.0)
    closed = Target.parse(f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(UpstreamError) as err:
        await pool.send(closed, b"POST", "/", [], b"{}", 5.0)
    assert err.value.reason == "connect"

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(10)

    with pytest.raises(TimeoutError):
        await pool.send(await serve(silent), b"POST", "/", [], b"{}", 0.2)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()

    with pytest.raises(UpstreamError) as err:
        await pool.send(await serve(garbage), b"POST", "/", [], b"{}", 5.0)
    assert err.value.reason == "broken"

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()
        writer.close()

    r = await pool.send(await serve(cut), b"POST", "/", [], b"{}", 5.0)
    with pytest.raises(UpstreamError):
        await r.read(5.0)
    r.close()
    pool.close()


def test_targets_keep_the_url_path_and_the_host_header() -> None:
    t = Target.parse("https://vllm.example:8443/base/")
    assert (t.host, t.port, t.tls, t.authority, t.prefix) == (
        "vllm.example",
        8443,
        True,
        b"vllm.example:8443",
        "/base",
    )
    assert Target.parse("http://a").port == 80
