"""Metrics, health endpoints, JSON logs with request ids, and no secrets anywhere."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.logs import JsonFormatter
from tests.support import closed_port, sample, wait_until

Start = Callable[..., tuple[str, Any]]
MODEL = "mistral-7b-chat"


def test_metrics_cover_requests_latency_overhead_decisions_and_backends(
    start_worker: Start, start_gateway: Start
) -> None:
    w, _ = start_worker()
    url, _ = start_gateway([{"url": w, "id": "w0"}])
    httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "stream": True,
        },
    ) as r:
        r.read()
    httpx.post(url + "/v1/embeddings", json={"model": MODEL, "input": "hi"})
    httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 0})
    wait_until(lambda: "edgeroute_backend_healthy" in httpx.get(url + "/metrics").text)
    text = httpx.get(url + "/metrics").text
    chat, completions = "/v1/chat/completions", "/v1/completions"
    for series in (
        # requests by endpoint: each path counted apart, a refused body under its own
        f'edgeroute_requests_total{{backend="w0",endpoint="{chat}",model="{MODEL}",'
        'status="200"} 2.0',
        f'edgeroute_requests_total{{backend="w0",endpoint="/v1/embeddings",model="{MODEL}",'
        'status="200"} 1.0',
        f'edgeroute_requests_total{{backend="w0",endpoint="{completions}",model="{MODEL}",'
        'status="200"} 1.0',
        # (a body refused is not trusted to name a model)
        f'edgeroute_requests_total{{backend="none",endpoint="{completions}",model="unknown",'
        'status="400"} 1.0',
        f'edgeroute_request_duration_seconds_count{{backend="w0",model="{MODEL}"}} 4.0',
        f'edgeroute_time_to_first_token_seconds_count{{backend="w0",model="{MODEL}"}} 1.0',
        "edgeroute_inter_token_latency_seconds_bucket",
        "edgeroute_gateway_overhead_seconds_count 4.0",
        'edgeroute_policy_decision_seconds_count{policy="least_load"} 4.0',
        'edgeroute_policy_decisions_total{backend="w0",policy="least_load"} 4.0',
        'edgeroute_backend_healthy{backend="w0"} 1.0',
        'edgeroute_backend_circuit_state{backend="w0"} 0.0',
        'edgeroute_inflight_requests{backend="w0"}',
        "edgeroute_replica_inflight_requests",
        'edgeroute_backend_stats_age_seconds{backend="w0"}',
        "edgeroute_telemetry_staleness_seconds",
        "edgeroute_store_up 1.0",
    ):
        assert series in text, series
    assert "vllm:" not in text


def test_healthz_and_readyz(start_worker: Start, start_gateway: Start) -> None:
    w, _ = start_worker()
    url, _ = start_gateway([w])
    assert httpx.get(url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(url + "/readyz").status_code == 200
    dead_url, _ = start_gateway([f"http://127.0.0.1:{closed_port()}"])
    wait_until(lambda: httpx.get(dead_url + "/readyz").status_code == 503, timeout=3)
    assert httpx.get(dead_url + "/healthz").status_code == 200


def test_logs_are_json_with_the_request_id_and_never_hold_secrets_or_bodies(
    start_worker: Start, start_gateway: Start, caplog: pytest.LogCaptureFixture
) -> None:
    w, _ = start_worker(enable_faults=True, fault={"mode": "error", "status": 500})
    url, _ = start_gateway([w], api_keys=["sk-client-secret"], retries=0)
    caplog.set_level(logging.DEBUG, logger="edgeroute")
    secret_body = "my-private-prompt-text"
    r = httpx.post(
        url + "/v1/chat/completions",
        headers={"authorization": "Bearer sk-client-secret", "x-request-id": "rid-9"},
        json={"model": MODEL, "messages": [{"role": "user", "content": secret_body}]},
    )
    assert r.status_code == 502
    httpx.post(
        url + "/v1/chat/completions",
        headers={"authorization": "Bearer sk-wrong-key"},
        json={"model": MODEL, "messages": [{"role": "user", "content": secret_body}]},
    )
    httpx.get(url + "/admin/backends", headers={"authorization": "Bearer not-the-admin-token"})
    lines = [JsonFormatter().format(rec) for rec in caplog.records]
    assert lines
    failed = [json.loads(line) for line in lines if "request failed" in line]
    assert failed and failed[0]["request_id"] == "rid-9" and failed[0]["status"] == 502
    everything = "\n".join(lines) + httpx.get(url + "/metrics").text
    for secret in (
        "sk-client-secret",
        "sk-wrong-key",
        "test-admin-token",
        "not-the-admin-token",
        secret_body,
    ):
        assert secret not in everything


def test_each_backends_seconds_per_token_is_shown_to_operators(
    start_worker: Start, start_gateway: Start
) -> None:
    """What the QoS policy reads of a backend's speed, in the admin API and the metrics:
    none (0) before a request there ends, then the answered request's seconds per
    token, which the gateway measured inside the client's own wait."""
    used, _ = start_worker()
    unused, _ = start_worker()
    url, _ = start_gateway(
        [{"url": used, "id": "used"}, {"url": unused, "id": "unused", "draining": True}]
    )
    admin = {"authorization": "Bearer test-admin-token"}  # the test settings' token

    def shown() -> dict[str, float]:
        state = httpx.get(url + "/admin/backends", headers=admin).json()["backends"]
        return {b["id"]: b["token_latency_s"] for b in state}

    assert shown() == {"used": 0.0, "unused": 0.0}
    with httpx.Client(timeout=30) as client:
        t0 = time.perf_counter()
        r = client.post(
            url + "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
            },
        )
        waited = time.perf_counter() - t0
    assert r.status_code == 200 and r.headers["x-edgeroute-backend"] == "used"
    tokens = r.json()["usage"]["completion_tokens"]
    seen = shown()
    assert seen["unused"] == 0.0
    assert 0 < seen["used"] <= waited / tokens
    wait_until(
        lambda: (
            sample(
                httpx.get(url + "/metrics").text,
                "edgeroute_backend_token_latency_seconds",
                backend="used",
            )
            == seen["used"]
        )
    )
