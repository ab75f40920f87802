"""How many concurrent streams one worker process sustains at time scale 1.

`edgeroute bench worker-capacity`: one worker (pinned to CPU 0) runs a 25 ms
per-token engine (base 25 ms; no prefill or batch cost, so the prediction does
not depend on how the client's C streams spread their arrivals, and every level
stays in the 20-40 ms band); the client (CPU 1) opens C streams at once. Each stream's
measured mean inter-token latency is compared with the profile's prediction
(the same submissions replayed through the scheduler without a clock). The
timing error is the mean relative error over streams; the capacity is the
largest C whose error stays within 5%.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from edgeroute.bench.loadgen import Conn, post
from edgeroute.bench.overhead import pin, wait_ready
from edgeroute.results_io import Plot, write
from workers.engine import Sequence, replay
from workers.profiles import PROFILES

BASE, K1, K2 = 0.025, 0.0, 0.0
PROMPT_TOKENS, OUT_TOKENS = 100, 60
LIMIT = 0.05


async def stream_itls(port: int, n: int) -> list[float]:
    """Open n streams at once; each one's mean inter-token gap (s)."""
    conns = [await Conn.open("127.0.0.1", port) for _ in range(n)]

    async def one(i: int, conn: Conn) -> float:
        content = (f"{i:07d} " + "lorem ipsum " * 60)[: PROMPT_TOKENS * 4]
        body = (
            f'{{"model":"mistral-7b-chat","messages":[{{"role":"user","content":"{content}"'
            f'}}],"max_tokens":{OUT_TOKENS},"stream":true}}'
        ).encode()
        conn.writer.write(post("/v1/chat/completions", body))
        reader = conn.reader
        await reader.readuntil(b"\r\n\r\n")
        stamps = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            now = time.perf_counter()
            stamps.extend(
                [now] * data.count(b'"content":"')
                if b'"role"' not in data
                else [now] * max(0, data.count(b'"content":"') - 1)
            )
        conn.close()
        stamps = stamps[-OUT_TOKENS:]
        return (stamps[-1] - stamps[0]) / (len(stamps) - 1)

    return await asyncio.gather(*(one(i, c) for i, c in enumerate(conns)))


def predicted_itl(n: int) -> float:
    profile = PROFILES["mistral-7b-chat"].with_overrides(base=BASE, k1=K1, k2=K2)
    seqs = [Sequence(f"s{i}", PROMPT_TOKENS, OUT_TOKENS) for i in range(n)]
    return statistics.fmean(t.mean_itl for t in replay(profile, seqs))


@contextlib.contextmanager
def emulated_worker(port: int) -> Iterator[None]:
    """The worker under test on `port`, on CPU 0, ready; its stderr is quoted if it
    exits before it is."""
    args = ["worker", "--port", str(port), "--log-level", "WARNING"]
    for key, value in (("base", BASE), ("k1", K1), ("k2", K2), ("max_batch", 4096)):
        args += ["--set", f"{key}={value}"]
    with tempfile.TemporaryFile() as said:
        worker = subprocess.Popen(
            [sys.executable, "-m", "edgeroute.cli", *args],
            stdout=subprocess.DEVNULL,
            stderr=said,
            preexec_fn=lambda: pin(0),
        )
        try:
            wait_ready(f"http://127.0.0.1:{port}/health", proc=worker, said=said)
            yield
        finally:
            worker.terminate()
            worker.wait(10)


def main(quick: bool, seed: int, json_path: str | None) -> None:
    levels = [16, 64, 256] if quick else [16, 32, 64, 128, 192, 256, 384, 512, 768, 1024]
    port = 18650
    pin(1)
    rows: list[dict[str, Any]] = []
    with emulated_worker(port):
        asyncio.run(stream_itls(port, 4))  # warm-up
        for n in levels:
            itls = asyncio.run(stream_itls(port, n))
            want = predicted_itl(n)
            err = statistics.fmean(abs(x - want) / want for x in itls)
            rows.append(
                {
                    "streams": n,
                    "predicted_itl_ms": want * 1e3,
                    "measured_itl_ms": statistics.fmean(itls) * 1e3,
                    "worst_itl_ms": max(itls) * 1e3,
                    "timing_error_pct": err * 100,
                    "within_5pct": err <= LIMIT,
                }
            )
            print(
                f"  {n:>5} streams: itl {statistics.fmean(itls) * 1e3:6.2f} ms "
                f"(predicted {want * 1e3:.2f}), error {err * 100:5.2f}%",
                flush=True,
            )
            if err > 3 * LIMIT:
                break
    ok = [r["streams"] for r in rows if r["within_5pct"]]
    capacity = max(ok) if ok else 0
    print(f"\ncapacity: {capacity} concurrent streams within {LIMIT:.0%} timing error")
    write(
        "worker_capacity",
        {
            "command": "edgeroute bench worker-capacity",
            "base_s": BASE,
            "k1": K1,
            "k2": K2,
            "prompt": PROMPT_TOKENS,
            "out_tokens": OUT_TOKENS,
            "capacity": capacity,
            "cpus": os.cpu_count(),
            "seed": seed,
        },
        rows,
        [
            "streams",
            "predicted_itl_ms",
            "measured_itl_ms",
            "worst_itl_ms",
            "timing_error_pct",
            "within_5pct",
        ],
        json_path,
        quick=quick,
        plot=Plot(
            "streams",
            ("predicted_itl_ms", "measured_itl_ms", "timing_error_pct"),
            title="One emulated worker: inter-token latency, predicted and measured",
            log_x=True,
        ),
        notes=f"Capacity: **{capacity}** concurrent streams per worker process within "
        f"{LIMIT:.0%} timing error (worker on one core, client on the other).",
    )
