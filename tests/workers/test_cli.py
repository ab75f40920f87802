"""`edgeroute worker` options reach the worker."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx


def test_set_overrides_and_enable_faults(worker_process: Callable[..., Any]) -> None:
    wp = worker_process(
        "--set", "base=0.2", "--set", "kv_blocks=64", "--enable-faults", "--admin-token", "t0k"
    )
    body = {"model": "mistral-7b-chat", "prompt": "x", "max_tokens": 3}
    t0 = time.perf_counter()
    assert httpx.post(wp.url + "/v1/completions", json=body, timeout=10).status_code == 200
    assert time.perf_counter() - t0 > 0.55  # three iterations of 0.2 s
    fault = {"mode": "error", "status": 503}
    assert httpx.post(wp.url + "/admin/fault", json=fault).status_code == 401
    wrong = {"authorization": "Bearer nope"}
    assert httpx.post(wp.url + "/admin/fault", json=fault, headers=wrong).status_code == 401
    r = httpx.post(wp.url + "/admin/fault", json=fault, headers={"authorization": "Bearer t0k"})
    assert r.status_code == 200
    assert httpx.post(wp.url + "/v1/completions", json=body).status_code == 503


def test_the_admin_api_is_closed_without_a_token(worker_process: Callable[..., Any]) -> None:
    wp = worker_process("--enable-faults")
    assert httpx.post(wp.url + "/admin/fault", json={"mode": "error"}).status_code == 401
    for token in ("Bearer", "Bearer anything", "anything"):
        r = httpx.post(
            wp.url + "/admin/fault", json={"mode": "error"}, headers={"authorization": token}
        )
        assert r.status_code == 401
    body = {"model": "mistral-7b-chat", "prompt": "x", "max_tokens": 1}
    assert httpx.post(wp.url + "/v1/completions", json=body, timeout=10).status_code == 200


def test_faults_are_off_unless_enabled(worker_process: Callable[..., Any]) -> None:
    wp = worker_process()
    assert httpx.post(wp.url + "/admin/fault", json={"mode": "error"}).status_code in (404, 405)
