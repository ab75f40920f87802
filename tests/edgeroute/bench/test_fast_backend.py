"""The benchmark's fast backend, held: it answers late and reports what it holds as an
engine's running and waiting counts (what keeps the gateway's queues full in `bench
overhead`'s full-queue phase)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from edgeroute.bench.overhead import wait_ready
from gateway.ports import free_ports
from tests.support import sample, wait_until


@pytest.fixture
def held_backend() -> Iterator[str]:
    port = free_ports(1)[0]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgeroute.bench.fast_backend",
            "--port",
            str(port),
            "--hold-ms",
            "3000",
            "--batch",
            "2",
        ]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + "/health", proc=proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def held(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics").text
    return sample(text, "vllm:num_requests_running"), sample(text, "vllm:num_requests_waiting")


def test_held_answers_count_as_running_then_waiting(held_backend: str) -> None:
    body = {"model": "instant", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}

    async def three() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            sent = [
                asyncio.create_task(client.post(held_backend + "/v1/chat/completions", json=body))
                for _ in range(3)
            ]
            await asyncio.to_thread(wait_until, lambda: held(held_backend) == (2, 1), 30.0)
            return list(await asyncio.gather(*sent))

    answers = asyncio.run(three())
    assert [r.status_code for r in answers] == [200] * 3
    assert all(r.json()["usage"]["completion_tokens"] == 3 for r in answers)
    assert held(held_backend) == (0, 0)


def test_a_client_gone_while_held_is_released_without_harm(held_backend: str) -> None:
    """The hostile twin: a client that sends and hangs up before the answer."""
    port = int(held_backend.rsplit(":", 1)[1])
    payload = b'{"model":"instant","messages":[],"max_tokens":2}'
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
            % (len(payload), payload)
        )
        wait_until(lambda: held(held_backend) == (1, 0), 30.0)
    wait_until(lambda: held(held_backend) == (0, 0), 30.0)
    later = httpx.post(held_backend + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert later.status_code == 200 and later.json()["choices"][0]["text"] == "tok "
