"""`edgeroute worker` options reach the worker."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx


def test_set_overrides_and_enable_faults(worker_process: Callable[..., Any]) -> None:
    wp = worker_process("--set", "base=0.2", "--set", "kv_blocks=64", "--enable-faults")
    body = {"model": "mistral-7b-chat", "prompt": "x", "max_tokens": 3}
    t0 = time.perf_counter()
    assert httpx.post(wp.url + "/v1/completions", json=body, timeout=10).status_code == 200
    assert time.perf_counter() - t0 > 0.55  # three iterations of 0.2 s
    r = httpx.post(wp.url + "/admin/fault", json={"mode": "error", "status": 503})
    assert r.status_code == 200
    assert httpx.post(wp.url + "/v1/completions", json=body).status_code == 503


def test_faults_are_off_unless_enabled(worker_process: Callable[..., Any]) -> None:
    wp = worker_process()
    assert httpx.post(wp.url + "/admin/fault", json={"mode": "error"}).status_code in (404, 405)
