"""Every error a client can get, each in OpenAI's shape with the right status."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.support import closed_port, hold_streams, sample, wait_until

Start = Callable[..., tuple[str, Any]]
CHAT = "/v1/chat/completions"
MODEL = "mistral-7b-chat"


def chat_body(**kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    body.update(kw)
    return body


def assert_openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return dict(err)


@pytest.fixture
def gw(start_worker: Start, start_gateway: Start) -> Iterator[str]:
    wurl, _ = start_worker()
    url, _ = start_gateway([wurl], api_keys=["sk-good"], max_body_bytes=4096)
    yield url


AUTH = {"authorization": "Bearer sk-good"}


def test_400_bad_json_and_bad_schema(gw: str) -> None:
    r = httpx.post(gw + CHAT, content=b"{not json", headers=AUTH)
    assert_openai_error(r, 400)
    bad_utf8 = httpx.post(gw + CHAT, content=b'{"model": "\xff\xfe"}', headers=AUTH)
    assert_openai_error(bad_utf8, 400)
    for body, param in [
        ([1, 2], None),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        (chat_body(messages="hello"), "messages"),
        (chat_body(messages=[]), "messages"),
        (chat_body(messages=[{"content": "no role"}]), "messages"),
        (chat_body(max_tokens=0), "max_tokens"),
        (chat_body(max_tokens=10**12), "max_tokens"),
        (chat_body(temperature=9), "temperature"),
        (chat_body(stream="yes"), "stream"),
        (chat_body(stop=[1, 2]), "stop"),
    ]:
        err = assert_openai_error(httpx.post(gw + CHAT, json=body, headers=AUTH), 400)
        assert err["param"] == param, body
    deep = b'{"model":"x","messages":' + b"[" * 10000 + b"]" * 10000 + b"}"
    assert_openai_error(httpx.post(gw + CHAT, content=deep, headers=AUTH), 413)
    completion = httpx.post(gw + "/v1/completions", json={"model": MODEL}, headers=AUTH)
    assert assert_openai_error(completion, 400)["param"] == "prompt"


def test_401_missing_or_bad_client_key(gw: str) -> None:
    for headers in ({}, {"authorization": "Bearer sk-bad"}, {"authorization": "sk-good"}):
        r = httpx.post(gw + CHAT, json=chat_body(), headers=headers)
        err = assert_openai_error(r, 401)
        assert err["code"] == "invalid_api_key"
    assert httpx.post(gw + CHAT, json=chat_body(), headers=AUTH).status_code == 200


def test_404_unknown_model(gw: str) -> None:
    r = httpx.post(gw + CHAT, json=chat_body(model="gpt-9"), headers=AUTH)
    err = assert_openai_error(r, 404)
    assert err["param"] == "model" and err["code"] == "model_not_found"


def test_413_body_over_the_limit_declared_or_chunked(gw: str) -> None:
    big = chat_body(messages=[{"role": "user", "content": "x" * 5000}])
    assert_openai_error(httpx.post(gw + CHAT, json=big, headers=AUTH), 413)

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "mistral-7b-chat", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}]}'

    r = httpx.post(gw + CHAT, content=chunks(), headers=AUTH)  # no content-length
    assert_openai_error(r, 413)


def test_429_when_the_replica_is_at_its_inflight_limit(
    start_worker: Start, start_gateway: Start
) -> None:
    wurl, _ = start_worker(speedup=1.0)
    url, _ = start_gateway([wurl], max_inflight=1)
    release = threading.Event()
    held = hold_streams(url, MODEL, 1, release)
    try:
        wait_until(
            lambda: (
                httpx.get(url + "/metrics").text.find("edgeroute_replica_inflight_requests 1.0")
                >= 0
            )
        )
        r = httpx.post(url + CHAT, json=chat_body())
        assert_openai_error(r, 429)
        assert int(r.headers["retry-after"]) >= 1
    finally:
        release.set()
        held[0].join(30)


def test_503_with_retry_after_when_no_backend_can_serve(
    start_worker: Start, start_gateway: Start
) -> None:
    wurl, _ = start_worker()
    url, gw = start_gateway(
        [{"url": wurl, "id": "w0", "draining": True}], routing={"default": {"policy": "least_load"}}
    )
    r = httpx.post(url + CHAT, json=chat_body())
    err = assert_openai_error(r, 503)
    assert err["code"] == "no_capacity" and int(r.headers["retry-after"]) >= 1
    metrics = httpx.get(url + "/metrics").text
    assert sample(metrics, "edgeroute_shed_requests_total", reason="healthy") == 1


QUEUE_CAP_1 = {
    "default": {
        "policy": "least_load",
        "filters": [
            "healthy",
            "serves_model",
            {"type": "queue_cap", "params": {"max_requests": 1}},
        ],
    }
}


def inflight(url: str) -> float:
    return sample(httpx.get(url + "/metrics").text, "edgeroute_replica_inflight_requests")


def test_503_with_retry_after_when_every_backend_is_at_its_queue_cap(
    start_worker: Start, start_gateway: Start
) -> None:
    """Admission control: with `queue_cap` at 1, a second request while the only backend
    serves one is shed at once, in OpenAI's shape, and the held one still completes;
    once it has, the next is served."""
    wurl, _ = start_worker(speedup=1.0)
    url, _ = start_gateway([wurl], routing=QUEUE_CAP_1)
    release = threading.Event()
    held = hold_streams(url, MODEL, 1, release)
    try:
        wait_until(lambda: inflight(url) == 1)
        r = httpx.post(url + CHAT, json=chat_body())
        err = assert_openai_error(r, 503)
        assert err["code"] == "no_capacity" and "'queue_cap'" in err["message"]
        assert int(r.headers["retry-after"]) >= 1
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError, match="queue_cap"):
            sdk.chat.completions.create(**chat_body())
    finally:
        release.set()
        held[0].join(30)
    assert not held[0].is_alive()
    wait_until(lambda: inflight(url) == 0)
    answer = sdk.chat.completions.create(**chat_body())
    assert answer.choices[0].message.content
    metrics = httpx.get(url + "/metrics").text
    assert sample(metrics, "edgeroute_shed_requests_total", reason="queue_cap") == 2


def test_the_queue_cap_holds_against_a_backend_that_hangs_and_reports_an_empty_queue(
    start_worker: Start, start_gateway: Start
) -> None:
    """The hostile twin: the backend accepts requests and never answers, and its
    engine's metrics say nothing is running or waiting. The cap is then held by the
    gateway's own count: the second request is shed, and when the first one's client
    leaves, the backend takes one again."""
    wurl, _ = start_worker(enable_faults=True, fault={"mode": "hang"})
    url, _ = start_gateway(
        [wurl],
        routing=QUEUE_CAP_1,
        timeouts={"first_byte": 600, "response": 600, "stall": 600, "connect": 0.5, "scrape": 0.5},
    )
    port = int(url.rsplit(":", 1)[1])
    body = orjson.dumps(chat_body())
    raw = (
        f"POST {CHAT} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body

    def hang_one() -> socket.socket:
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(raw)
        return client

    first = hang_one()
    try:
        wait_until(lambda: inflight(url) == 1)
        engine = httpx.get(wurl + "/metrics").text  # what a scrape of it reads: empty
        assert sample(engine, "vllm:num_requests_running") == 0
        assert sample(engine, "vllm:num_requests_waiting") == 0
        r = httpx.post(url + CHAT, json=chat_body())
        err = assert_openai_error(r, 503)
        assert err["code"] == "no_capacity" and int(r.headers["retry-after"]) >= 1
        assert inflight(url) == 1
    finally:
        first.close()
    wait_until(lambda: inflight(url) == 0)
    second = hang_one()  # admitted again: the cap counts requests in flight, not ever sent
    try:
        wait_until(lambda: inflight(url) == 1)
    finally:
        second.close()
    wait_until(lambda: inflight(url) == 0)


def test_502_when_backends_fail_or_are_unreachable(
    start_worker: Start, start_gateway: Start
) -> None:
    wurl, _ = start_worker(enable_faults=True, fault={"mode": "error", "status": 500})
    dead = f"http://127.0.0.1:{closed_port()}"
    url, _ = start_gateway([wurl, dead], retries=1)
    r = httpx.post(url + CHAT, json=chat_body())
    assert_openai_error(r, 502)


def test_502_when_a_backend_answers_garbage(start_worker: Start, start_gateway: Start) -> None:
    """A 200 whose body is not JSON (or, streamed, not server-sent events) is a failure:
    the client gets a 502, never the garbage, and the backend's circuit counts it.
    Default settings: retries=2 with one backend."""
    wurl, _ = start_worker(enable_faults=True, fault={"mode": "garbage"})
    url, gw = start_gateway([{"url": wurl, "id": "bad"}], circuit={"failures": 50})
    err = assert_openai_error(httpx.post(url + CHAT, json=chat_body()), 502)
    assert "not JSON" in err["message"]
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
    assert raised.value.status_code == 502
    assert gw.pool.get("bad").circuit.failures >= 2
    metrics = httpx.get(url + "/metrics").text
    assert sample(metrics, "edgeroute_requests_total", status="502") == 2
    assert sample(metrics, "edgeroute_retries_total", backend="bad", reason="garbage") == 2


def test_504_when_the_backend_hangs(start_worker: Start, start_gateway: Start) -> None:
    wurl, _ = start_worker(enable_faults=True, fault={"mode": "hang"})
    url, _ = start_gateway(
        [wurl],
        retries=0,
        timeouts={"connect": 0.5, "first_byte": 0.5, "response": 0.5, "idle": 1.0, "scrape": 0.5},
    )
    r = httpx.post(url + CHAT, json=chat_body(), timeout=10)
    assert_openai_error(r, 504)


def test_unknown_routes_and_methods_are_openai_errors(gw: str) -> None:
    assert_openai_error(httpx.get(gw + "/v1/nothing"), 404)
    assert_openai_error(httpx.get(gw + CHAT), 405)


def test_models_need_the_client_key_and_one_model_can_be_retrieved(gw: str) -> None:
    for path in ("/v1/models", f"/v1/models/{MODEL}"):
        assert_openai_error(httpx.get(gw + path), 401)
    sdk = openai.OpenAI(base_url=gw + "/v1", api_key="sk-good", max_retries=0)
    assert [m.id for m in sdk.models.list()] == [MODEL]
    assert sdk.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        sdk.models.retrieve("no-such-model")
    # /health is vLLM's probe (load generators call it first); no key needed for it.
    assert httpx.get(gw + "/health").json() == {"status": "ok"}
