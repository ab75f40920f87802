"""A lean HTTP/1.1 keep-alive load generator on raw asyncio streams.

Its own cost per request is a few tens of microseconds, so it measures the
server, not the client. It speaks just enough HTTP for JSON and SSE responses.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[object]]


def post(path: str, body: bytes, host: str = "127.0.0.1") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        return cls(reader, writer)

    async def request(self, raw: bytes) -> tuple[int, float, float]:
        """Send one request; (status, seconds to first body bytes, seconds to the end)."""
        t0 = time.perf_counter()
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        first = 0.0
        if b"transfer-encoding: chunked" in lower:
            while True:
                size_line = await self.reader.readuntil(b"\r\n")
                size = int(size_line.strip().split(b";")[0], 16)
                if first == 0.0:
                    first = time.perf_counter() - t0
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            i = lower.find(b"content-length:")
            n = int(lower[i + 15 : lower.find(b"\r\n", i)]) if i >= 0 else 0
            await self.reader.readexactly(n)
            first = time.perf_counter() - t0
        return status, first, time.perf_counter() - t0

    def close(self) -> None:
        self.writer.close()


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)  # of 200 responses
    first_bytes: list[float] = field(default_factory=list)
    errors: int = 0  # responses other than 200
    statuses: Counter[int] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0


async def closed_loop(
    host: str, port: int, raw: bytes, concurrency: int, seconds: float, warmup: float = 0.5
) -> Run:
    """`concurrency` connections each sending back to back for `seconds` (after a warm-up)."""
    run = Run()
    conns = [await Conn.open(host, port) for _ in range(concurrency)]
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + seconds

    async def one(conn: Conn) -> None:
        while (now := time.perf_counter()) < stop_at:
            status, first, total = await conn.request(raw)
            if now >= measure_from:
                run.statuses[status] += 1
                if status == 200:
                    run.latencies.append(total)
                    run.first_bytes.append(first)
                else:
                    run.errors += 1

    await asyncio.gather(*(one(c) for c in conns))
    run.seconds = time.perf_counter() - measure_from
    for c in conns:
        c.close()
    return run


async def until(
    deadline: float, clock: Clock = time.perf_counter, sleep: Sleep = asyncio.sleep
) -> float:
    """Wait until `deadline` on `clock`; how late the wait ended (s, 0 if on time)."""
    delay = deadline - clock()
    if delay > 0:
        await sleep(delay)
    return max(0.0, clock() - deadline)


async def paced(
    instants: Sequence[float], clock: Clock = time.perf_counter, sleep: Sleep = asyncio.sleep
) -> AsyncIterator[float]:
    """Each of `instants` (s after the first call, on `clock`) as it comes, with how late
    it came: an open loop. Each wait aims at its own instant, so a late wake-up delays
    one send and not the ones after it; sleeping each gap in turn would add every
    wake-up's overshoot to all later sends, a slower arrival rate than the one drawn."""
    start = clock()
    for t in instants:
        yield await until(start + t, clock, sleep)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


def cpu_seconds(pid: int) -> float:
    """User+system CPU time of a process and its children so far (Linux /proc)."""
    import os

    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    ticks = sum(int(x) for x in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")
