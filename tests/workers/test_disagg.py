"""Prefill/decode roles and emulated KV transfers over the shared topology."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest

from gateway.promtext import read_by_label
from oracle.topology import Topology
from tests.support import wait_until
from workers.kvtransfer import SharedLink
from workers.server import Worker

Start = Callable[..., tuple[str, Worker]]

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
    assert timings["far"] - timings["near"] == pytest.approx(far_xfer - near_xfer, rel=0.15)
    # The decode side skips the prefill it received: its prompt counter grew by one token.
    assert near.engine.stats.prompt_tokens == 1
    metrics = httpx.get(far_url + "/metrics").text
    assert 'vllm:nixl_xfer_time_seconds_count{model_name="mistral-7b-chat"} 1.0' in metrics


async def test_concurrent_flows_share_a_tier_and_speed_up_when_one_ends() -> None:
    capacity = 100e6  # bytes per second
    link = SharedLink(lambda: capacity, speedup=1.0)
    t0 = time.perf_counter()

    async def send(nbytes: float) -> float:
        await link.send(nbytes)
        return time.perf_counter() - t0

    # Alone, 10 MB takes 0.1 s. Two flows of 10 MB and 20 MB: both at 50 MB/s until
    # the first ends at 0.2 s; the second then has 10 MB left at the full 100 MB/s.
    lone = await send(10e6)
    assert lone == pytest.approx(0.1, rel=0.1)
    t0 = time.perf_counter()
    a, b = await asyncio.gather(send(10e6), send(20e6))
    assert a == pytest.approx(0.2, rel=0.1)
    assert b == pytest.approx(0.3, rel=0.1)


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
