"""Disaggregated serving through the gateway: prefill, KV transfer, NetKV decode choice."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

from tests.support import RedisProcess, sample, wait_until

Start = Callable[..., tuple[str, Any]]
TOKEN = {"authorization": "Bearer test-admin-token"}
MODEL = "mistral-7b-chat"
PROFILE = {"kv_bytes_per_token": 131072}  # the mistral-7b-chat worker profile's
TOPOLOGY: dict[str, Any] = {
    "instances": {
        "p0": {"node": "n0", "rack": "r0", "pod": "a"},
        "dA": {"node": "n1", "rack": "r0", "pod": "a"},  # rack tier from p0
        "dB": {"node": "n2", "rack": "r1", "pod": "a"},
    },  # pod tier from p0
    "tier_bandwidth": {"node": 3200.0, "rack": 100.0, "pod": 50.0, "cluster": 12.5},
    "tier_latency": {"node": 1.0, "rack": 5.0, "pod": 10.0, "cluster": 20.0},
}
SHARED = "Shared retrieval context. " * 320  # 8,000 characters: 2,000 tokens


def setup(start_worker: Start, start_gateway: Start, redis: RedisProcess) -> tuple[str, Any]:
    workers = {}
    emulators = []
    for name, role in (("p0", "prefill"), ("dA", "decode"), ("dB", "decode")):
        url, w = start_worker(role=role, instance_id=name, speedup=1.0, redis_url=redis.url)
        workers[name] = {"url": url, "id": name, "role": role, "profile": PROFILE}
        emulators.append(w)
    url, gw = start_gateway(list(workers.values()), redis_url=redis.url)
    assert (
        httpx.put(url + "/admin/oracle/topology", headers=TOKEN, json=TOPOLOGY).status_code == 200
    )
    assert (
        httpx.put(url + "/admin/oracle/congestion", headers=TOKEN, json={"rack": 0.95}).status_code
        == 200
    )
    # The workers follow the oracle (once a second).
    wait_until(
        lambda: all(
            w.config.topology is not None and w.config.topology.congestion.get("rack") == 0.95
            for w in emulators
        ),
        timeout=30,
    )
    return url, gw


def kv_received(gw: Any, backend: str) -> tuple[float, float]:
    """(transfers, bytes) of KV a decode worker has received, from its /metrics."""
    text = httpx.get(gw.pool.get(backend).config.url + "/metrics").text
    return (
        sample(text, "vllm:nixl_bytes_transferred_count"),
        sample(text, "vllm:nixl_bytes_transferred_sum"),
    )


def ask(url: str, tag: str, stream: bool = False) -> tuple[str, float]:
    # Half the prompt is the shared context, half is this request's own.
    own = (f"{tag}: " + "details of this particular question " * 300)[: len(SHARED)]
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "stream": stream,
        "messages": [{"role": "user", "content": SHARED + own}],
    }
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        first = None
        for _ in r.iter_bytes():
            first = first or time.perf_counter() - t0
    assert first is not None
    return r.headers["x-edgeroute-backend"], first


def test_netkv_avoids_the_congested_tier_that_cla_picks_for_its_cache(
    start_worker: Start, start_gateway: Start, redis_server: RedisProcess
) -> None:
    url, gw = setup(start_worker, start_gateway, redis_server)
    # Warm dA's cache with the shared context (dB drained for this one request).
    httpx.post(url + "/admin/backends/dB/drain", headers=TOKEN)
    assert ask(url, "warm-up")[0] == "dA"
    httpx.post(url + "/admin/backends/dB/undrain", headers=TOKEN)
    wait_until(lambda: not gw.pool.get("dB").draining)

    before = kv_received(gw, "dA")
    httpx.put(url + "/admin/routing/decode", headers=TOKEN, json={"policy": "decode_cla"})
    cla = [ask(url, f" question {i}") for i in range(3)]
    httpx.put(url + "/admin/routing/decode", headers=TOKEN, json={"policy": "netkv_full"})
    netkv = [ask(url, f" other question {i}") for i in range(3)]

    assert {b for b, _ in cla} == {"dA"}  # the warm cache behind the congested tier
    assert {b for b, _ in netkv} == {"dB"}  # the cold instance on the free tier
    # What crossed the wire, by the decode workers' own transfer metrics: half the
    # prompt into dA (its cache holds the rest), all of it into dB the first time (then
    # its cache holds the shared half too). Over 5% of 100 Gbps that half takes ~0.42 s,
    # the whole over 50 Gbps ~0.08 s. (The TTFTs the client sees are wall-clock time on
    # a loaded machine: `bench netkv --live` measures those, tests do not.)
    (a_count, a_bytes), (b_count, b_bytes) = kv_received(gw, "dA"), kv_received(gw, "dB")
    per_cla = (a_bytes - before[1]) / (a_count - before[0])
    per_netkv = b_bytes / b_count
    assert a_count - before[0] == 3 and b_count == 3
    gbps = TOPOLOGY["tier_bandwidth"]
    wire_cla = per_cla * 8 / (gbps["rack"] * 1e9 * (1 - 0.95))
    wire_netkv = per_netkv * 8 / (gbps["pod"] * 1e9)
    assert wire_netkv < wire_cla - 0.2, (wire_cla, wire_netkv)

    metrics = httpx.get(url + "/metrics").text
    assert 'edgeroute_pd_requests_total{decode="dB",prefill="p0",tier="pod"} 3.0' in metrics
    assert 'edgeroute_pd_ttft_seconds_count{tier="rack"}' in metrics
    wait_until(
        lambda: len(httpx.get(url + "/admin/oracle/intents", headers=TOKEN).json()["intents"]) == 7,
        timeout=3,
    )
    intent = httpx.get(url + "/admin/oracle/intents?count=1", headers=TOKEN).json()["intents"][0]
    assert intent["source"] == "p0" and intent["destination"] == "dB"
    assert intent["tier"] == "pod" and intent["payload_bytes"] > 0
    assert gw.transfers.counts == {}  # every transfer's completion was seen


def test_streaming_and_the_sdk_work_disaggregated(
    start_worker: Start, start_gateway: Start, redis_server: RedisProcess
) -> None:
    url, gw = setup(start_worker, start_gateway, redis_server)
    p0 = gw.pool.get("p0").config.url
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    chunks = list(
        c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    r = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert r.usage is not None and r.usage.completion_tokens == 3
    before = _prefill_seconds(p0)
    raw = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "x " * 16_000}], max_tokens=1
    )
    # The prefill's round trip (about a second of engine time for 8,000 tokens, which
    # at speedup 1 is at least as long on the wall) is upstream time, not overhead.
    prefill = _prefill_seconds(p0) - before
    assert prefill > 0.5
    assert float(raw.headers["x-edgeroute-overhead-ms"]) / 1000 < prefill


def _prefill_seconds(worker: str) -> float:
    """The engine seconds of the requests `worker` has finished (its e2e histogram)."""
    metrics = httpx.get(worker + "/metrics").text
    return sample(metrics, "vllm:e2e_request_latency_seconds_sum")


def test_no_feasible_decode_instance_is_a_clear_503(
    start_worker: Start, start_gateway: Start, redis_server: RedisProcess
) -> None:
    url, _ = setup(start_worker, start_gateway, redis_server)
    for d in ("dA", "dB"):
        httpx.post(url + f"/admin/backends/{d}/drain", headers=TOKEN)
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 503 and r.headers["retry-after"]
    # Draining both decode instances leaves none past the 'healthy' filter.
    assert "no backend passed the 'healthy' filter" in r.json()["error"]["message"]


def test_self_contention_lasts_until_the_first_event_not_the_response_head(
    start_worker: Start, start_gateway: Start, servers: Any
) -> None:
    """A decode engine answers its head at once and its first event only once the KV
    cache has arrived (vLLM streams so). The transfer counts against NetKV's
    self-contention until that first event, not from the head."""
    arrived, released = threading.Event(), threading.Event()

    async def chat(request: Request) -> StreamingResponse:
        await request.body()
        arrived.set()

        async def events() -> AsyncIterator[bytes]:
            while not released.is_set():
                await asyncio.sleep(0.01)
            chunk = {
                "id": "chatcmpl-held",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": MODEL,
                "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
            }
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def empty(_: Request) -> PlainTextResponse:
        return PlainTextResponse("")

    held = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/health", empty),
            Route("/metrics", empty),
        ]
    )
    decode_url, _ = servers.serve(held)
    prefill_url, _ = start_worker(role="prefill", instance_id="p0", speedup=1.0)
    url, gw = start_gateway(
        [
            {"url": prefill_url, "id": "p0", "role": "prefill", "models": [MODEL]},
            {"url": decode_url, "id": "dB", "role": "decode", "models": [MODEL]},
        ],
        oracle=TOPOLOGY,
    )
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}],
    }
    done: list[int] = []

    def client() -> None:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
            r.read()
            done.append(r.status_code)

    thread = threading.Thread(target=client)
    thread.start()
    try:
        wait_until(arrived.is_set, timeout=30)
        wait_until(lambda: gw.transfers.counts == {("p0", "pod"): 1})
        assert gw.transfers.counts == {("p0", "pod"): 1}  # the head alone does not end it
    finally:
        released.set()
        thread.join(30)
    assert done == [200]
    wait_until(lambda: gw.transfers.counts == {})


def test_embeddings_are_never_split_into_prefill_and_decode(
    start_worker: Start, start_gateway: Start
) -> None:
    """An embedding has nothing to decode: it goes whole to a backend of role `both`,
    and a model served only disaggregated has none to give it (a clear 503, not a
    prefill's one-token answer dressed as an embedding)."""
    backends = []
    for name, role in (("p0", "prefill"), ("d0", "decode")):
        url, _ = start_worker(role=role, instance_id=name)
        backends.append({"url": url, "id": name, "role": role, "profile": PROFILE})
    url, _ = start_gateway(backends)
    body = {"model": MODEL, "input": "hi"}
    r = httpx.post(url + "/v1/embeddings", json=body)
    assert r.status_code == 503 and r.headers["retry-after"]
    assert "no backend passed the 'role' filter" in r.json()["error"]["message"]
    whole, _ = start_worker(instance_id="w0")
    url, _ = start_gateway([*backends, {"url": whole, "id": "w0", "profile": PROFILE}])
    r = httpx.post(url + "/v1/embeddings", json=body)
    assert r.status_code == 200 and r.headers["x-edgeroute-backend"] == "w0"
    assert len(r.json()["data"]) == 1
