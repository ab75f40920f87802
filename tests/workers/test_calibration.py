"""The live worker's timing against its profile's prediction, as a client sees it.

The prediction replays the same submissions through the scheduler without a
clock; the live worker must match it within 10% at several loads.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from workers.engine import Sequence, replay
from workers.profiles import PROFILES
from workers.server import Worker

PROFILE = PROFILES["mistral-7b-chat"]
TOLERANCE = 0.10


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


async def stream_timing(
    client: httpx.AsyncClient, i: int, prompt_tokens: int, out_tokens: int
) -> tuple[float, float]:
    """(TTFT, mean inter-token latency) in wall seconds."""
    t0, stamps = await stream_stamps(client, i, prompt_tokens, out_tokens)
    return stamps[0] - t0, (stamps[-1] - stamps[0]) / (out_tokens - 1)


@pytest.mark.parametrize("concurrency", [1, 4, 16])
async def test_ttft_and_tpot_match_the_profile(
    worker_process: Callable[..., Any], concurrency: int
) -> None:
    # The worker runs in its own process: timing must not share a GIL with the client.
    url = worker_process("--speedup", "1").url
    prompt_tokens, out_tokens = 200, 12
    # Answers are drawn per prompt; ask for fewer tokens than any mbpp answer gives.
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        # One warm-up: the first request on a fresh server and connection pays ~15 ms of
        # one-off set-up that is not part of the engine model.
        await stream_timing(client, -1, 20, 2)
        results = await asyncio.gather(
            *(stream_timing(client, i, prompt_tokens, out_tokens) for i in range(concurrency))
        )
    ttft = sum(r[0] for r in results) / concurrency
    itl = sum(r[1] for r in results) / concurrency
    want_ttft, want_itl = predicted(concurrency, prompt_tokens + 1, out_tokens)
    assert abs(ttft - want_ttft) / want_ttft < TOLERANCE, (ttft, want_ttft)
    assert abs(itl - want_itl) / want_itl < TOLERANCE, (itl, want_itl)


async def _mean_itl_of_first_request(url: str, rate: float, speedup: float) -> float:
    """Mean per-token latency (emulated s) of one long request while others arrive at `rate`."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        probe = asyncio.create_task(stream_timing(client, 999, 100, 80))
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
        _, itl = await probe
        await asyncio.gather(*others)
    return itl * speedup


async def test_per_token_latency_rises_with_arrival_rate(
    worker_process: Callable[..., Any],
) -> None:
    speedup = 2.0
    url = worker_process("--speedup", str(speedup)).url
    itls = [await _mean_itl_of_first_request(url, rate, speedup) for rate in (0, 5, 15, 40)]
    assert all(a < b for a, b in itertools.pairwise(itls)), itls
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
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        cold, _ = await stream_timing(client, 7, 1500, 2)
        warm, _ = await stream_timing(client, 7, 1500, 2)
        metrics = (await client.get("/metrics")).text
    assert warm < cold * 0.5, (cold, warm)
    hits = [line for line in metrics.splitlines() if line.startswith("vllm:prefix_cache_hits")]
    assert hits and float(hits[0].split()[-1]) >= 1400
