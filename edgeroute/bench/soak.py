"""`edgeroute bench soak`: mixed streaming traffic for a long while, watching the gateway.

Four emulated workers, one gateway (cla), and clients that mix streamed and plain
chat requests of varied lengths, some abandoning their stream part-way. Every ten
seconds it records the gateway's memory (RSS) and open file descriptors and the
responses so far. At the end it reports their drift and every error by kind: with
no fault injected, an error is unexplained.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from edgeroute.bench.overhead import LOAD_CPU, emulated_pool, pin
from edgeroute.bench.overload import rss_mb
from edgeroute.results_io import output_dir, save_figure, write


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _client(url: str, stop: asyncio.Event, tally: Counter[str], seed: int) -> None:
    rng = random.Random(seed)
    limits = httpx.Limits(max_keepalive_connections=1)
    async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
        while not stop.is_set():
            stream = rng.random() < 0.7
            body = {
                "model": "edge",
                "messages": [{"role": "user", "content": f"Question {rng.randrange(10**6)}"}],
                "max_tokens": rng.choice([8, 32, 128]),
                "stream": stream,
            }
            try:
                async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    if stream and rng.random() < 0.1:
                        async for _ in r.aiter_lines():
                            break  # the client leaves part-way: that is not an error
                        tally["abandoned"] += 1
                        continue
                    text = (await r.aread()).decode()
                    if r.status_code != 200:
                        tally[f"status {r.status_code}"] += 1
                    elif stream and not text.rstrip().endswith("data: [DONE]"):
                        tally["stream ended without [DONE]"] += 1
                    else:
                        tally["ok"] += 1
            except httpx.HTTPError as exc:
                tally[type(exc).__name__] += 1


async def _drive(url: str, pid: int, seconds: float, clients: int) -> list[dict[str, Any]]:
    tally: Counter[str] = Counter()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_client(url, stop, tally, i)) for i in range(clients)]
    samples = []
    t0 = time.monotonic()
    while (elapsed := time.monotonic() - t0) < seconds:
        await asyncio.sleep(min(10.0, seconds - elapsed))
        sample = {
            "t_s": round(time.monotonic() - t0),
            "rss_mb": round(rss_mb(pid), 1),
            "fds": open_fds(pid),
            **tally,
        }
        samples.append(sample)
        print(sample, flush=True)
    stop.set()
    await asyncio.gather(*tasks)
    samples[-1].update(tally)
    return samples


def plot(samples: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t_s"] / 60 for s in samples]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    ax.plot(t, [s["rss_mb"] for s in samples], label="gateway RSS (MB)")
    ax.set_xlabel("minutes")
    ax.set_ylabel("MB")
    ax2 = ax.twinx()
    ax2.plot(t, [s["fds"] for s in samples], color="tab:orange", label="open fds")
    ax2.set_ylabel("file descriptors")
    ax.set_ylim(0, 1.25 * max(s["rss_mb"] for s in samples))
    ax2.set_ylim(0, 1.25 * max(s["fds"] for s in samples))
    fig.legend(loc="lower right", fontsize=8)
    fig.suptitle("Soak: gateway memory and file descriptors under mixed streaming traffic")
    fig.tight_layout()
    save_figure(fig, out, dpi=100)
    plt.close(fig)


def main(quick: bool, minutes: float, json_path: str | None) -> None:
    pin(LOAD_CPU)
    seconds = 30.0 if quick else minutes * 60
    port = 18670
    worker_args = ["--speedup", "20", "--served-model-name", "edge"]
    with emulated_pool(4, port, worker_args, "cla") as gw:
        samples = asyncio.run(_drive(f"http://127.0.0.1:{port}", gw.pid, seconds, 24))
    warm = samples[min(1, len(samples) - 1)]  # after the first interval's warm-up
    last = samples[-1]
    errors = {k: v for k, v in last.items() if k not in ("t_s", "rss_mb", "fds", "ok", "abandoned")}
    notes = (
        f"{seconds / 60:g} minutes, 24 clients (70% streamed, 10% of streams abandoned "
        f"part-way). RSS {warm['rss_mb']} MB after the first sample, {last['rss_mb']} MB "
        f"at the end; open fds {warm['fds']} -> {last['fds']}. Completed: {last.get('ok', 0)}, "
        f"abandoned by the client: {last.get('abandoned', 0)}, errors: {errors or 'none'}."
        "\n\n![memory and file descriptors over the soak](soak.png)"
    )
    print(notes)
    write(
        "soak",
        {"command": f"edgeroute bench soak --minutes {minutes:g}", "seconds": seconds},
        samples,
        ["t_s", "rss_mb", "fds", "ok", "abandoned", *sorted(errors)],
        json_path,
        quick=quick,
        notes=notes,
    )
    plot(samples, output_dir(quick) / "soak.png")
