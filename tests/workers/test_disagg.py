"""Prefill/decode roles and emulated KV transfers over the shared topology."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
import pytest

from gateway.promtext import read_by_label
from oracle.topology import Topology
from tests.support import VirtualClockLoop, sample, wait_until
from workers.kvtransfer import SharedLink
from workers.server import Worker

Start = Callable[..., tuple[str, Worker]]
T = TypeVar("T")

TOPOLOGY = Topology(
    instances={
        "p0": {"node": "n0", "rack": "r0", "pod": "a"},
        "d-near": {"node": "n1", "rack": "r0", "pod": "a"},
        "d-far": {"node": "n9", "rack": "r9", "pod": "b"},
    },
    tier_bandwidth={"node": 400.0, "rack": 100.0, "pod": 50.0, "cluster": 10.0},
    tier_latency={"node": 2.0, "rack": 5.0, "pod": 10.0, "cluster": 50.0},
    congestion={"cluster": 0.5},
)


async def test_prefill_then_decode_with_vllm_kv_transfer_params(start_worker: Start) -> None:
    purl, prefill = start_worker(role="prefill", instance_id="p0", topology=TOPOLOGY, speedup=1.0)
    near_url, near = start_worker(
        role="decode", instance_id="d-near", topology=TOPOLOGY, speedup=1.0
    )
    far_url, _far = start_worker(role="decode", instance_id="d-far", topology=TOPOLOGY, speedup=1.0)
    prompt = "a long shared document " * 300  # 1725 tokens
    body = {
        "model": "mistral-7b-chat",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    async with httpx.AsyncClient(timeout=30) as c:
        first = (await c.post(purl + "/v1/chat/completions", json=body)).json()
        params = first["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["remote_engine_id"] == "p0"
        assert first["usage"]["completion_tokens"] == 1
        timings = {}
        for name, url in (("near", near_url), ("far", far_url)):
            decode = {**body, "max_tokens": 4, "kv_transfer_params": params, "stream": False}
            t0 = time.perf_counter()
            r = await c.post(url + "/v1/chat/completions", json=decode)
            timings[name] = time.perf_counter() - t0
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    nbytes = 1725 * prefill.profile.kv_bytes_per_token  # 226 MB
    far_xfer = TOPOLOGY.transfer_seconds("p0", "d-far", nbytes)  # cluster tier, rho 0.5
    near_xfer = TOPOLOGY.transfer_seconds("p0", "d-near", nbytes)
    assert far_xfer > 0.3 > near_xfer
    # Each decode instance took the transfer time of its tier, by its own clock (exact
    # however loaded the host), and the client waited at least that long.
    for name, url, xfer in (("near", near_url, near_xfer), ("far", far_url, far_xfer)):
        metrics = httpx.get(url + "/metrics").text
        assert 'vllm:nixl_xfer_time_seconds_count{model_name="mistral-7b-chat"} 1.0' in metrics
        assert sample(metrics, "vllm:nixl_xfer_time_seconds_sum") == pytest.approx(xfer)
        assert timings[name] >= xfer
    # The decode side skips the prefill it received: its prompt counter grew by one token.
    assert near.engine.stats.prompt_tokens == 1


def on_virtual_clock(scenario: Callable[[VirtualClockLoop], Awaitable[T]]) -> T:
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(scenario(loop))
    finally:
        loop.close()


MB = 1e6


def timed_sends(
    sizes: list[float], capacity: float = 100 * MB, speedup: float = 1.0, hog: float = 0.0
) -> tuple[list[float], list[float]]:
    """The loop's times the sends returned at, and the emulated seconds they reported,
    for flows started together on one link; `hog` > 0: the host is busy from 0.15 s for
    `hog` seconds (a callback that holds the loop)."""

    async def scenario(loop: VirtualClockLoop) -> list[tuple[float, float]]:
        link = SharedLink(lambda: capacity, speedup=speedup)

        async def send(nbytes: float) -> tuple[float, float]:
            took = await link.send(nbytes)
            return loop.time(), took

        if hog:
            loop.call_at(0.15, loop.hold, hog)
        return list(await asyncio.gather(*(send(n) for n in sizes)))

    ends = on_virtual_clock(scenario)
    return [seen for seen, _ in ends], [took for _, took in ends]


def test_a_lone_flow_takes_its_size_over_the_capacity() -> None:
    seen, took = timed_sends([10 * MB])
    assert seen == pytest.approx([0.1]) and took == pytest.approx([0.1])
    # with the engines ten times faster than real time, one tenth of the wall time
    seen, took = timed_sends([10 * MB], speedup=10.0)
    assert seen == pytest.approx([0.01]) and took == pytest.approx([0.1])
    assert timed_sends([0.0]) == ([0.0], [0.0])


def test_concurrent_flows_share_a_tier_and_speed_up_when_one_ends() -> None:
    # Two flows of 10 MB and 20 MB: both at 50 MB/s until the first ends at 0.2 s; the
    # second then has 10 MB left at the full 100 MB/s.
    seen, took = timed_sends([10 * MB, 20 * MB])
    assert seen == pytest.approx([0.2, 0.3]) and took == pytest.approx([0.2, 0.3])


def test_a_busy_host_delays_when_a_flow_is_seen_to_end_but_not_the_shares() -> None:
    """Hostile twin: the host holds the loop from 0.15 s to 0.25 s, past the first
    flow's end at 0.2 s. Both flows report the times they would have taken on time;
    the second ends at 0.3 s as before (it had the whole link from 0.2 s), not later as
    if it had shared the link until the host woke."""
    seen, took = timed_sends([10 * MB, 20 * MB], hog=0.1)
    assert took == pytest.approx([0.2, 0.3]) and seen == pytest.approx([0.25, 0.3])


def test_a_cancelled_flow_gives_its_share_back() -> None:
    async def scenario(loop: VirtualClockLoop) -> tuple[float, float]:
        link = SharedLink(lambda: 100 * MB)
        left = loop.create_task(link.send(10 * MB))
        stays = loop.create_task(link.send(10 * MB))
        await asyncio.sleep(0.1)  # 5 MB of each carried
        left.cancel()
        took = await stays
        assert link.active == 0
        return loop.time(), took

    assert on_virtual_clock(scenario) == pytest.approx((0.15, 0.15))


def test_a_flow_slows_when_the_tier_congests_and_the_link_counts_its_busy_time() -> None:
    async def scenario(loop: VirtualClockLoop) -> tuple[float, float, float]:
        capacity = [100 * MB]
        link = SharedLink(lambda: capacity[0])

        def congest() -> None:
            capacity[0] = 50 * MB
            link.refresh()

        loop.call_at(0.05, congest)  # 5 MB carried at 100 MB/s, 5 MB left at 50 MB/s
        took = await link.send(10 * MB)
        seen = loop.time()
        await asyncio.sleep(1.0)  # idle: not busy
        await link.send(5 * MB)
        return seen, took, link.busy_seconds

    assert on_virtual_clock(scenario) == pytest.approx((0.15, 0.15, 0.25))


def background_levels(url: str) -> dict[str, float]:
    return read_by_label(httpx.get(url + "/metrics").text, "emulator:link_background", "tier")


def test_a_decode_instance_has_its_own_weather_and_counts_its_busy_link(
    start_worker: Start,
) -> None:
    """The worker's network is its own: its background wanders around means it was
    given (it reads no oracle), and its links count the seconds they carried KV."""
    calm = TOPOLOGY.model_copy(update={"congestion": {}})
    purl, _ = start_worker(role="prefill", instance_id="p0", topology=calm, speedup=20.0)
    url, worker = start_worker(
        role="decode",
        instance_id="d-far",
        topology=calm,
        speedup=20.0,
        background={"cluster": 0.4},
        seed=3,
    )
    assert worker.config.redis_url is None
    seen: set[float] = set()

    def wandered() -> bool:
        level = background_levels(url).get("cluster")
        if level is not None:
            seen.add(level)
        return len(seen) >= 3

    wait_until(wandered, timeout=30)
    assert all(0.0 <= v <= 0.95 for v in seen)
    assert worker.config.topology is not None and "cluster" in worker.config.topology.congestion
    body = {
        "model": "mistral-7b-chat",
        "messages": [{"role": "user", "content": "a long shared document " * 300}],
        "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    params = httpx.post(purl + "/v1/chat/completions", json=body, timeout=30).json()
    decode = {**body, "max_tokens": 2, "kv_transfer_params": params["kv_transfer_params"]}
    assert httpx.post(url + "/v1/chat/completions", json=decode, timeout=30).status_code == 200
    text = httpx.get(url + "/metrics").text
    busy = read_by_label(text, "emulator:link_busy_seconds_total", "tier")
    assert busy["cluster"] > 0


def test_a_flow_cancelled_after_it_ended_unseen_is_cancelled_cleanly() -> None:
    """Hostile twin: the host holds the loop past a flow's end, and the client cancels
    before the link has seen it end; the link, catching up, finds it ended."""

    async def scenario(loop: VirtualClockLoop) -> tuple[bool, int]:
        link = SharedLink(lambda: 100 * MB)
        sending = loop.create_task(link.send(10 * MB))  # ends at 0.1 s
        loop.call_at(0.05, loop.hold, 0.15)
        loop.call_at(0.06, sending.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await sending
        return sending.cancelled(), link.active

    assert on_virtual_clock(scenario) == (True, 0)


def test_a_stalled_tier_holds_its_flows_until_it_frees_and_an_unbounded_one_none() -> None:
    async def scenario(loop: VirtualClockLoop) -> tuple[float, float, float]:
        capacity = [0.0]  # a tier at full congestion carries nothing
        link = SharedLink(lambda: capacity[0])

        def free() -> None:
            capacity[0] = 100 * MB
            link.refresh()

        loop.call_at(0.5, free)
        took = await link.send(10 * MB)
        seen = loop.time()
        unbounded = SharedLink(lambda: math.inf)
        return seen, took, await unbounded.send(10 * MB)

    assert on_virtual_clock(scenario) == pytest.approx((0.6, 0.6, 0.0))
