"""Proxying: streaming pass-through, the openai SDK, retries, failures mid-stream."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.support import closed_port, wait_until

Start = Callable[..., tuple[str, Any]]
CHAT = "/v1/chat/completions"
MODEL = "mistral-7b-chat"
MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me something."}]


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-any", max_retries=0, timeout=30)


def test_openai_sdk_sync_plain_and_streaming(start_worker: Start, start_gateway: Start) -> None:
    w1, _ = start_worker()
    w2, _ = start_worker(profile="llama-2-70b-chat", served_model_names=["llama-2-70b-chat"])
    url, _ = start_gateway([w1, w2])
    c = sdk(url)
    r = c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=5)
    assert r.usage is not None and r.usage.completion_tokens == 5
    chunks = list(
        c.chat.completions.create(
            model=MODEL,
            messages=MSG,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    comp = c.completions.create(model=MODEL, prompt="Once", max_tokens=3)
    assert comp.usage is not None and comp.usage.completion_tokens == 3
    assert sorted(m.id for m in c.models.list()) == ["llama-2-70b-chat", MODEL]
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=1)
    assert raw.headers["x-edgeroute-backend"]
    assert float(raw.headers["x-edgeroute-overhead-ms"]) >= 0
    assert raw.headers["x-request-id"]


def test_token_id_and_batched_completions_pass_through(
    start_worker: Start, start_gateway: Start
) -> None:
    """The SDK's batch of token-id prompts through the gateway: n choices per prompt,
    whole and streamed; a prompt list a backend would refuse is refused at the edge."""
    w, _ = start_worker()
    url, _ = start_gateway([w])
    c = sdk(url)
    prompts = [list(range(100, 400)), [7] * 10]
    whole = c.completions.create(model=MODEL, prompt=prompts, max_tokens=3, n=2)
    assert [ch.index for ch in whole.choices] == [0, 1, 2, 3]
    assert whole.usage is not None and whole.usage.prompt_tokens == 310
    streamed = ["", "", "", ""]
    for chunk in c.completions.create(model=MODEL, prompt=prompts, max_tokens=3, n=2, stream=True):
        for ch in chunk.choices:
            streamed[ch.index] += ch.text
    assert streamed == [ch.text for ch in whole.choices]
    with pytest.raises(openai.BadRequestError) as err:
        c.completions.create(model=MODEL, prompt=[[1, 2], "three"], max_tokens=3)  # type: ignore[arg-type]
    assert err.value.body is not None and err.value.body["param"] == "prompt"  # type: ignore[index]
    assert "x-edgeroute-backend" not in err.value.response.headers  # no backend saw it


async def test_openai_sdk_async_plain_and_streaming(
    start_worker: Start, start_gateway: Start
) -> None:
    w1, _ = start_worker()
    url, _ = start_gateway([w1])
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-any", max_retries=0)
    results = await asyncio.gather(
        *(c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=3) for _ in range(8))
    )
    assert all(r.usage is not None and r.usage.completion_tokens == 3 for r in results)
    stream = await c.chat.completions.create(
        model=MODEL,
        messages=MSG,
        max_tokens=6,
        stream=True,
    )
    pieces = [ch.choices[0].delta.content async for ch in stream if ch.choices]
    assert len([p for p in pieces if p]) == 6
    await c.close()


def test_request_id_is_propagated_and_unknown_fields_pass_through(
    start_worker: Start, start_gateway: Start
) -> None:
    # A prefill-role worker answers kv_transfer_params only if the field reached it.
    w, _ = start_worker(role="prefill", instance_id="p0")
    url, _ = start_gateway([{"url": w, "role": "both"}])
    r = httpx.post(
        url + CHAT,
        headers={"x-request-id": "req-123"},
        json={
            "model": MODEL,
            "messages": MSG,
            "max_tokens": 1,
            "top_k": 5,
            "kv_transfer_params": {"do_remote_decode": True},
        },
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "req-123"
    assert r.json()["kv_transfer_params"]["remote_engine_id"] == "p0"


def test_streaming_is_relayed_chunk_by_chunk(start_worker: Start, start_gateway: Start) -> None:
    # Speedup 1: about 20 ms per token, so 40 tokens take ~0.8 s of the engine's time.
    # Causal, not timed: each chunk is checked against how far the engine had got.
    w, worker = start_worker(speedup=1.0)
    url, _ = start_gateway([w])
    generated = worker.engine.stats
    before = generated.generation_tokens
    still_generating: list[bool] = []
    with httpx.stream(
        "POST",
        url + CHAT,
        timeout=30,
        json={"model": MODEL, "messages": MSG, "max_tokens": 40, "stream": True},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                still_generating.append(generated.generation_tokens - before < 40)
    assert len(still_generating) >= 40
    assert still_generating[0]  # the first chunk did not wait for the rest
    # Chunks came as they were generated, not in one burst at the end.
    assert sum(still_generating) >= 20


def test_retry_moves_to_another_backend_before_the_first_byte(
    start_worker: Start, start_gateway: Start
) -> None:
    good, _ = start_worker()
    failing, _ = start_worker(enable_faults=True, fault={"mode": "error", "status": 503})
    dead = f"http://127.0.0.1:{closed_port()}"
    url, gw = start_gateway(
        [
            {"url": good, "id": "good"},
            {"url": failing, "id": "failing"},
            {"url": dead, "id": "dead", "models": [MODEL]},
        ],
        routing={"default": {"policy": "round_robin"}},
        circuit={"failures": 100, "open_seconds": 1},
    )
    backends: Counter[str] = Counter()
    for _ in range(12):
        r = httpx.post(url + CHAT, json={"model": MODEL, "messages": MSG, "max_tokens": 2})
        assert r.status_code == 200, r.text
        backends[r.headers["x-edgeroute-backend"]] += 1
    assert backends == {"good": 12}
    metrics = httpx.get(url + "/metrics").text
    assert 'edgeroute_retries_total{backend="failing",reason="status_503"}' in metrics
    assert 'edgeroute_retries_total{backend="dead",reason="connect"}' in metrics, [
        line for line in metrics.splitlines() if "retries" in line or "dead" in line
    ]


def test_a_worker_killed_mid_stream_ends_the_stream_with_an_error_event(
    worker_process: Callable[..., Any], start_gateway: Start
) -> None:
    victim = worker_process("--speedup", "1")
    # An idle limit past the client's own read timeout (30 s): the error event can only
    # come from the dead socket, not from waiting out the silence.
    url, _ = start_gateway(
        [victim.url], timeouts={"connect": 0.5, "first_byte": 5.0, "idle": 600.0, "scrape": 0.5}
    )
    c = sdk(url)
    stream = c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=200, stream=True)
    received = 0
    with pytest.raises(openai.APIError) as err:
        for _chunk in stream:
            received += 1
            if received == 3:
                victim.kill()
    assert "mid-stream" in str(err.value) and "went silent" not in str(err.value)
    assert 3 <= received < 50


def test_an_aborting_backend_ends_the_stream_with_an_error_event(
    start_worker: Start, start_gateway: Start
) -> None:
    w, _ = start_worker(enable_faults=True, fault={"mode": "abort", "after_tokens": 3})
    url, _ = start_gateway([w])
    with httpx.stream(
        "POST",
        url + CHAT,
        timeout=10,
        json={"model": MODEL, "messages": MSG, "max_tokens": 20, "stream": True},
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert r.status_code == 200
    assert '"error"' in lines[-1] and "mid-stream" in lines[-1]
    assert not any("[DONE]" in line for line in lines)


# httptools: the gateway's own protocol tells the request (a scope hook); h11: the
# request's watch task sees `http.disconnect`, as under any ASGI server.
@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_client_disconnect_cancels_the_upstream_request(
    start_worker: Start, start_gateway: Start, parser: str
) -> None:
    w, worker = start_worker(speedup=1.0)
    url, gw = start_gateway([w], http_parser=parser)
    with httpx.stream(
        "POST",
        url + CHAT,
        timeout=10,
        json={"model": MODEL, "messages": MSG, "max_tokens": 500, "stream": True},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break
    wait_until(lambda: not worker.engine.running and not worker.engine.waiting, timeout=3)
    wait_until(lambda: gw.pool.total_inflight() == 0, timeout=3)
    # Non-streaming too: leave while the backend is still generating.
    done = threading.Event()

    def leave_early() -> None:
        try:
            httpx.post(
                url + CHAT, timeout=0.3, json={"model": MODEL, "messages": MSG, "max_tokens": 500}
            )
        except httpx.TimeoutException:
            done.set()

    leave_early()
    assert done.is_set()
    wait_until(lambda: not worker.engine.running and not worker.engine.waiting, timeout=3)
    assert worker.engine.stats.finished == 0


def test_circuit_opens_on_failures_and_recovers(start_worker: Start, start_gateway: Start) -> None:
    flaky_url, flaky = start_worker(enable_faults=True)
    steady_url, _ = start_worker()
    # A cool-down no loaded machine outlasts; the test ends it itself (below), so that
    # "open" is not a race against the clock.
    url, gw = start_gateway(
        [{"url": flaky_url, "id": "flaky"}, {"url": steady_url, "id": "steady"}],
        routing={"default": {"policy": "round_robin"}},
        circuit={"failures": 2, "open_seconds": 3600},
    )
    headers = {"authorization": "Bearer test-admin-token"}
    flaky.config.fault.mode = "error"
    for _ in range(6):
        r = httpx.post(url + CHAT, json={"model": MODEL, "messages": MSG, "max_tokens": 1})
        assert r.status_code == 200 and r.headers["x-edgeroute-backend"] == "steady"

    def state() -> str:
        rows = httpx.get(url + "/admin/backends", headers=headers).json()["backends"]
        return str(next(b["circuit"] for b in rows if b["id"] == "flaky"))

    assert state() == "open"
    wait_until(
        lambda: (
            'edgeroute_backend_circuit_state{backend="flaky"} 2.0'
            in httpx.get(url + "/metrics").text
        ),
        timeout=30,
    )
    # Fixed, and /health answers, but only a request served closes the circuit: past
    # the cool-down it is half-open until the next request there (its trial) succeeds.
    flaky.config.fault.mode = "none"
    time.sleep(0.3)  # a few good health probes during the cool-down
    assert state() == "open"
    circuit = gw.pool.get("flaky").circuit
    circuit.opened_at -= circuit.open_seconds  # the cool-down is over
    wait_until(lambda: state() == "half_open", timeout=30)
    time.sleep(0.3)  # a few good health probes
    assert state() == "half_open"
    wait_until(
        lambda: (
            httpx.post(url + CHAT, json={"model": MODEL, "messages": MSG, "max_tokens": 1})
            .raise_for_status()
            .headers["x-edgeroute-backend"]
            == "flaky"
        ),
        timeout=30,
    )
    assert state() == "closed"
    seen = Counter(
        httpx.post(url + CHAT, json={"model": MODEL, "messages": MSG, "max_tokens": 1}).headers[
            "x-edgeroute-backend"
        ]
        for _ in range(6)
    )
    assert seen["flaky"] == 3 and seen["steady"] == 3


def test_models_lists_only_healthy_backends(start_worker: Start, start_gateway: Start) -> None:
    w1, _ = start_worker()
    w2, _ = start_worker(profile="Yi-34B-Chat", served_model_names=["Yi-34B-Chat"])
    url, gw = start_gateway([{"url": w1, "id": "a"}, {"url": w2, "id": "b", "draining": True}])
    ids = [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]
    assert ids == [MODEL]


def test_embeddings_through_the_gateway_with_the_sdk(
    start_worker: Start, start_gateway: Start
) -> None:
    """The SDK's embeddings (base64 by default, floats when asked), one input or a
    batch of texts or token ids, routed like any request; a stream asked of it is
    refused at the edge."""
    import numpy as np

    w1, _ = start_worker(instance_id="w1")
    w2, _ = start_worker(instance_id="w2")
    url, _ = start_gateway([w1, w2], routing={"default": {"policy": "round_robin"}})
    c = sdk(url)
    one = c.embeddings.create(model=MODEL, input="The cat sat on the mat.")
    assert one.model == MODEL and len(one.data) == 1 and one.data[0].index == 0
    vector = np.array(one.data[0].embedding)
    assert vector.shape == (256,) and abs(np.linalg.norm(vector) - 1) < 1e-5
    floats = c.embeddings.create(
        model=MODEL, input="The cat sat on the mat.", encoding_format="float"
    )
    np.testing.assert_allclose(floats.data[0].embedding, vector, rtol=1e-6)
    texts = ["first", "second", "first"]
    batch = c.embeddings.create(model=MODEL, input=texts, dimensions=32)
    assert [d.index for d in batch.data] == [0, 1, 2]
    vectors = [np.array(d.embedding) for d in batch.data]
    assert all(v.shape == (32,) for v in vectors)
    np.testing.assert_array_equal(vectors[0], vectors[2])  # equal inputs, equal vectors
    assert not np.array_equal(vectors[0], vectors[1])
    ids = c.embeddings.create(model=MODEL, input=[[101, 102, 103], [7] * 40])
    assert len(ids.data) == 2 and ids.usage.prompt_tokens == 43
    backends = {
        c.embeddings.with_raw_response.create(model=MODEL, input="x").headers["x-edgeroute-backend"]
        for _ in range(4)
    }
    assert len(backends) == 2  # routed by the policy, as completions are
    r = httpx.post(url + "/v1/embeddings", json={"model": MODEL, "input": "x", "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    assert "x-edgeroute-backend" not in r.headers
    with pytest.raises(openai.NotFoundError):
        c.embeddings.create(model="no-such-model", input="x")
