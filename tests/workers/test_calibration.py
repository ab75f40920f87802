"""The worker's timing against its profile's prediction.

The prediction replays the same submissions through the scheduler without a clock.
The live engine keeps its own clock, which must give the same times whatever the
host's load; how closely the wall clock follows it is measured by `edgeroute bench
worker-capacity`, not asserted here.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.promtext import read_samples
from workers.engine import Engine, Sequence, replay
from workers.profiles import PROFILES
from workers.server import Worker

PROFILE = PROFILES["mistral-7b-chat"]


def predicted(concurrency: int, prompt_tokens: int, out_tokens: int) -> tuple[float, float]:
    """(TTFT, mean inter-token latency) for `concurrency` requests arriving together."""
    seqs = [Sequence(f"s{i}", prompt_tokens, out_tokens) for i in range(concurrency)]
    timelines = replay(PROFILE, seqs)
    ttft = sum(t.first for t in timelines) / concurrency
    itl = sum(t.mean_itl for t in timelines) / concurrency
    return ttft, itl


async def stream_stamps(
    client: httpx.AsyncClient, i: int, prompt_tokens: int, out_tokens: int
) -> tuple[float, list[float]]:
    """(send time, arrival time of each token) of one streamed request."""
    # Distinct prompts of equal length: no prefix-cache sharing between them.
    content = (f"{i:06d} " + "lorem ipsum dolor " * 400)[: prompt_tokens * 4]
    body = {
        "model": "mistral-7b-chat",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": out_tokens,
        "stream": True,
    }
    t0 = time.perf_counter()
    stamps = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"role"' not in line:
                stamps.append(time.perf_counter())
    assert len(stamps) == out_tokens
    return t0, stamps


@pytest.mark.parametrize("concurrency", [1, 4, 16])
async def test_the_engines_clock_follows_the_profile(concurrency: int) -> None:
    # The live engine's loop, paced (fast) by the wall clock: its own clock must give
    # exactly the prediction's times however late the host runs it. How closely wall
    # time follows is `bench worker-capacity`'s measurement, not a test's.
    prompt_tokens, out_tokens = 201, 12
    engine = Engine(PROFILE, speedup=50.0)
    seqs = [Sequence(f"s{i}", prompt_tokens, out_tokens) for i in range(concurrency)]
    for seq in seqs:  # all arrive together, as in the prediction
        engine.submit(seq)
    engine.start()
    try:
        for seq in seqs:
            while (await seq.tokens.get()) is not None:
                pass
    finally:
        await engine.stop()
    want = replay(
        PROFILE, [Sequence(f"s{i}", prompt_tokens, out_tokens) for i in range(concurrency)]
    )
    # Idle, the engine starts on the first arrival at once: the prediction's t=0.
    start = min(seq.arrival for seq in seqs)
    for seq, timeline in zip(seqs, want, strict=True):
        assert seq.generated == out_tokens
        assert seq.first_token_at - start == pytest.approx(timeline.first, rel=1e-9)  # type: ignore[operator]
        assert seq.last_token_at - start == pytest.approx(timeline.last, rel=1e-9)  # type: ignore[operator]


async def test_a_client_sees_the_profiles_ttft_and_itl_in_the_workers_metrics(
    start_worker: Callable[..., tuple[str, Worker]],
) -> None:
    # One request at a time over HTTP: the worker's own histograms (in its clock) hold
    # exactly the prediction's TTFT and inter-token latency.
    url, _ = start_worker(speedup=20.0)
    prompt_tokens, out_tokens, requests = 200, 12, 3
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for i in range(requests):
            await stream_stamps(client, i, prompt_tokens, out_tokens)
        text = (await client.get("/metrics")).text
    samples = read_samples(
        text,
        {
            "vllm:time_to_first_token_seconds_sum",
            "vllm:time_to_first_token_seconds_count",
            "vllm:inter_token_latency_seconds_sum",
            "vllm:inter_token_latency_seconds_count",
        },
    )
    want_ttft, want_itl = predicted(1, prompt_tokens, out_tokens)
    ttft = samples["vllm:time_to_first_token_seconds_sum"] / requests
    itl = (
        samples["vllm:inter_token_latency_seconds_sum"]
        / samples["vllm:inter_token_latency_seconds_count"]
    )
    assert samples["vllm:time_to_first_token_seconds_count"] == requests
    assert ttft == pytest.approx(want_ttft, rel=1e-6)
    assert itl == pytest.approx(want_itl, rel=1e-6)


async def _mean_itl_of_probe(url: str, worker: Worker, rate: float, speedup: float) -> float:
    """Mean per-token latency, in the engine's clock, of one long request while others
    arrive at `rate` (per emulated second, paced by the wall clock)."""
    stamps: dict[str, float] = {}

    def probe_times(event: str, seq: Sequence, now: float) -> None:
        if seq.id.startswith(f"chatcmpl-probe-{rate}") and event in ("first_token", "finished"):
            stamps[event] = now

    worker.engine.observers.append(probe_times)
    body = {
        "model": "mistral-7b-chat",
        "max_tokens": 80,
        "messages": [{"role": "user", "content": "p " * 200}],
    }
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        probe = asyncio.create_task(
            client.post(
                "/v1/chat/completions", json=body, headers={"x-request-id": f"probe-{rate}"}
            )
        )
        others: list[asyncio.Task[Any]] = []
        if rate > 0:
            t_end = time.perf_counter() + 80 * PROFILE.base / speedup
            i = 0
            while time.perf_counter() < t_end and not probe.done():
                others.append(
                    asyncio.create_task(
                        client.post(
                            "/v1/chat/completions",
                            json={
                                "model": "mistral-7b-chat",
                                "max_tokens": 4,
                                "messages": [{"role": "user", "content": f"{i} " + "x " * 400}],
                            },
                        )
                    )
                )
                i += 1
                await asyncio.sleep(1 / rate / speedup)
        assert (await probe).status_code == 200
        await asyncio.gather(*others)
    worker.engine.observers.remove(probe_times)
    return (stamps["finished"] - stamps["first_token"]) / 79


async def test_per_token_latency_rises_with_arrival_rate(
    start_worker: Callable[..., tuple[str, Worker]],
) -> None:
    speedup = 2.0
    url, worker = start_worker(speedup=speedup)
    itls = [await _mean_itl_of_probe(url, worker, rate, speedup) for rate in (0, 5, 15, 40)]
    assert all(a < b for a, b in itertools.pairwise(itls)), itls
    # Alone, the probe's iterations cost base + k2 * its context (100 to 180 tokens).
    assert itls[0] == pytest.approx(PROFILE.base + PROFILE.k2 * 140, rel=0.1)


async def test_a_request_blocked_on_memory_waits_then_runs(
    start_worker: Callable[..., tuple[str, Worker]],
) -> None:
    # 30 blocks of 16 tokens: the first request (up to 400 tokens) leaves too little
    # room for the second one's 301-token prompt until it finishes.
    url, worker = start_worker(speedup=4.0, overrides={"kv_blocks": 30})
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        first = asyncio.create_task(stream_stamps(client, 1, 300, 60))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(stream_stamps(client, 2, 300, 20))
        await asyncio.sleep(0.1)
        metrics = (await client.get("/metrics")).text
        assert 'vllm:num_requests_waiting{model_name="mistral-7b-chat"} 1.0' in metrics
        assert 'vllm:num_requests_running{model_name="mistral-7b-chat"} 1.0' in metrics
        _, first_stamps = await first
        _, second_stamps = await second
    # The second one's first token comes only after the first request's last.
    assert second_stamps[0] > first_stamps[-1]
    assert worker.engine.free_blocks == 30


async def test_prefix_cache_hits_cut_ttft(start_worker: Callable[..., tuple[str, Worker]]) -> None:
    url, _worker = start_worker(speedup=1.0)
    ttft = "vllm:time_to_first_token_seconds_sum"
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        # the worker's own TTFTs, in its clock: a loaded host changes neither
        await stream_stamps(client, 7, 1500, 2)
        cold = read_samples((await client.get("/metrics")).text, {ttft})[ttft]
        await stream_stamps(client, 7, 1500, 2)
        metrics = (await client.get("/metrics")).text
        warm = read_samples(metrics, {ttft})[ttft] - cold
    assert warm < cold * 0.5, (cold, warm)
    hits = [line for line in metrics.splitlines() if line.startswith("vllm:prefix_cache_hits")]
    assert hits and float(hits[0].split()[-1]) >= 1400
