"""The upstream client against a backend that breaks HTTP/1.1 on cue (tests/hostile.py).

Every case sends several requests in turn on one pool, each with its own seed, and
checks that each answer is its own: the rule is that a connection is reused only
after exactly one complete final response and nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from gateway.upstream import ResponseLimits, Target, UpstreamError, UpstreamPool
from tests.hostile import (
    HostileBackend,
    Play,
    Script,
    chunked,
    completion,
    response,
    seed_of,
)

Start = Callable[[Script], HostileBackend]


@pytest.fixture
def hostile() -> Iterator[Start]:
    started: list[HostileBackend] = []

    def start(script: Script) -> HostileBackend:
        b = HostileBackend(script)
        started.append(b)
        return b

    yield start
    for b in started:
        b.close()


async def ask(pool: UpstreamPool, url: str, seed: int, limit_read: bool = True) -> bytes:
    r = await pool.send(
        Target.parse(url), b"POST", "/v1/chat/completions", [], b'{"seed": %d}' % seed, 10.0
    )
    try:
        body = await r.read(10.0)
    except BaseException:
        r.close()
        raise
    r.release()
    return body


def _key(t: Target) -> tuple[str, int, bool]:
    return (t.host, t.port, t.tls)


def own(body: bytes, seed: int) -> bool:
    return f"seed={seed}".encode() in body and body.count(b"seed=") == 1


async def test_interim_responses_are_skipped(hostile: Start) -> None:
    def script(head: bytes, body: bytes, n: int) -> Play:
        interim = b"HTTP/1.1 100 Continue\r\n\r\n"
        if n % 2:
            interim += b"HTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n"
        return Play(interim + response(200, completion(seed_of(body))))

    b = hostile(script)
    pool = UpstreamPool(1.0)
    for seed in (3, 5, 7, 9):
        r = await pool.send(Target.parse(b.url), b"POST", "/", [], b'{"seed": %d}' % seed, 10.0)
        assert r.status == 200 and b"link" not in dict(r.raw_headers)
        assert own(await r.read(10.0), seed)
        r.release()
    assert b.connections == 1
    pool.close()


async def test_bytes_after_a_complete_answer_are_never_an_answer(hostile: Start) -> None:
    def script(head: bytes, body: bytes, n: int) -> Play:
        seed = seed_of(body)
        injected = response(200, completion(999_999))
        if n % 3 == 0:  # in the same write, after a short content-length
            real = completion(seed)
            return Play(response(200, real) + b"garbage" + injected)
        if n % 3 == 1:  # a whole second response behind the first
            return Play(response(200, completion(seed)) + injected)
        return Play(response(200, completion(seed)), late=injected)  # on the idle connection

    b = hostile(script)
    pool = UpstreamPool(1.0)
    target = Target.parse(b.url)
    for seed in range(30):
        assert own(await ask(pool, b.url, seed), seed)
        if seed % 3 == 2:
            # The late bytes land on the idle pooled connection, which must close.
            while pool.idle_count(target) and not pool._idle[_key(target)][0].closed:
                await asyncio.sleep(0.01)
    assert b.connections >= 20  # the poisoned connections were not reused
    pool.close()


async def test_chunked_extensions_and_trailers(hostile: Start) -> None:
    def script(head: bytes, body: bytes, n: int) -> Play:
        parts = [completion(seed_of(body))[:10], completion(seed_of(body))[10:]]
        return Play(chunked(200, parts, trailers=b"x-trailer: sneaky\r\n", ext=b";name=val"))

    b = hostile(script)
    pool = UpstreamPool(1.0)
    for seed in (1, 2, 3):
        r = await pool.send(Target.parse(b.url), b"POST", "/", [], b'{"seed": %d}' % seed, 10.0)
        body = await r.read(10.0)
        assert own(body, seed)
        assert b"x-trailer" not in {k.lower() for k, _ in r.raw_headers}
        r.release()
    assert b.connections == 1
    pool.close()


@pytest.mark.parametrize(
    "bad",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!",
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
    ],
    ids=["cl+te", "duplicate-cl", "101", "garbage"],
)
async def test_ambiguous_framing_is_refused_and_the_connection_dropped(
    hostile: Start, bad: bytes
) -> None:
    def script(head: bytes, body: bytes, n: int) -> Play:
        return Play(bad if n == 0 else response(200, completion(seed_of(body))))

    b = hostile(script)
    pool = UpstreamPool(1.0)
    with pytest.raises(UpstreamError) as err:
        await ask(pool, b.url, 1)
    assert err.value.reason == "broken"
    assert own(await ask(pool, b.url, 2), 2)
    assert b.connections == 2
    pool.close()


async def test_http10_close_delimited_and_204(hostile: Start) -> None:
    def script(head: bytes, body: bytes, n: int) -> Play:
        seed = seed_of(body)
        if n == 0:
            return Play(b"HTTP/1.0 200 OK\r\n\r\n" + completion(seed), close=True)
        if n == 1:
            return Play(
                b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + completion(seed), close=True
            )
        if n == 2:
            return Play(b"HTTP/1.1 204 No Content\r\n\r\n")
        return Play(response(200, completion(seed)))

    b = hostile(script)
    pool = UpstreamPool(1.0)
    assert own(await ask(pool, b.url, 10), 10)
    assert own(await ask(pool, b.url, 11), 11)
    assert await ask(pool, b.url, 12) == b""
    assert own(await ask(pool, b.url, 13), 13)  # on the 204's connection, reused
    assert b.connections == 3
    pool.close()


async def test_headers_split_byte_by_byte(hostile: Start) -> None:
    def script(head: bytes, body: bytes, n: int) -> Play:
        return Play(response(200, completion(seed_of(body)), b"x-a: 1", b"x-b: 2"), split=1)

    b = hostile(script)
    pool = UpstreamPool(1.0)
    for seed in (1, 2):
        assert own(await ask(pool, b.url, seed), seed)
    assert b.connections == 1
    pool.close()


async def test_a_backend_that_closes_after_each_answer(hostile: Start) -> None:
    def script(head: bytes, body: bytes, n: int) -> Play:
        return Play(response(200, completion(seed_of(body))), close=True)

    b = hostile(script)
    pool = UpstreamPool(1.0)
    for seed in range(20):
        assert own(await ask(pool, b.url, seed), seed)
    pool.close()


async def test_stale_pooled_connections_are_retried_on_a_fresh_one(hostile: Start) -> None:
    """Both pooled connections were closed by the backend as the request went out: the
    request still succeeds, on a new connection, with no error (finding 7)."""

    def script(head: bytes, body: bytes, n: int) -> Play:
        return Play(response(200, completion(seed_of(body))), hold=0.05 if n < 2 else 0.0)

    b = hostile(script)
    b.drop_reused = True
    pool = UpstreamPool(1.0)
    await asyncio.gather(ask(pool, b.url, 1), ask(pool, b.url, 2))
    assert pool.idle_count(Target.parse(b.url)) == 2
    assert own(await ask(pool, b.url, 3), 3)
    assert b.connections == 3
    pool.close()


async def test_response_header_limits(hostile: Start) -> None:
    many = [b"x-h%d: v" % i for i in range(20_000)]
    huge = [b"x-big: " + b"a" * (1 << 20)]

    def script(head: bytes, body: bytes, n: int) -> Play:
        extra = many if n == 0 else huge if n == 1 else []
        return Play(response(200, completion(seed_of(body)), *extra))

    b = hostile(script)
    pool = UpstreamPool(1.0, limits=ResponseLimits(max_headers=100, max_header_bytes=64 * 1024))
    for seed in (0, 1):
        with pytest.raises(UpstreamError) as err:
            await ask(pool, b.url, seed)
        assert err.value.reason == "headers_too_large"
    assert own(await ask(pool, b.url, 2), 2)
    pool.close()


async def test_a_body_read_whole_is_bounded(hostile: Start) -> None:
    def script(head: bytes, body: bytes, n: int) -> Play:
        return Play(
            response(200, b"x" * (4 << 20)) if n == 0 else response(200, completion(seed_of(body)))
        )

    b = hostile(script)
    pool = UpstreamPool(1.0, limits=ResponseLimits(max_body_bytes=1 << 20))
    with pytest.raises(UpstreamError) as err:
        await ask(pool, b.url, 0)
    assert err.value.reason == "body_too_large"
    assert own(await ask(pool, b.url, 1), 1)
    pool.close()


def test_the_host_header_never_carries_userinfo() -> None:
    assert Target.parse("http://user:pw@10.0.0.1:8000/v").authority == b"10.0.0.1:8000"
    assert Target.parse("http://[::1]:9000").authority == b"[::1]:9000"
    assert Target.parse("https://vllm.example").authority == b"vllm.example"
