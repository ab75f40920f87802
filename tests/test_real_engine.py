"""A real engine behind the gateway: llama.cpp's llama-server with a small GGUF model.

Optional: `make real-engine` builds (or reuses) the engine, fetches the model, and
runs this with LLAMA_SERVER and GGUF_MODEL set; without them it is skipped. It drives
the official SDK (whole, streamed, completions) through `edgeroute serve --backend`,
checks that the gateway reads the engine's load, and prints a short benchmark: the
same requests direct and through the gateway.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from gateway.ports import free_ports
from tests.support import wait_until

SERVER = os.environ.get("LLAMA_SERVER", "")
MODEL_FILE = os.environ.get("GGUF_MODEL", "")
MODEL = "gemma-3-270m"
TOKEN = "real-engine-token"

pytestmark = [
    pytest.mark.real_engine,
    pytest.mark.skipif(
        not (SERVER and MODEL_FILE and Path(SERVER).exists() and Path(MODEL_FILE).exists()),
        reason="needs LLAMA_SERVER and GGUF_MODEL: run `make real-engine`",
    ),
]


def started(
    cmd: list[str], health: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )

    def up() -> bool:
        assert proc.poll() is None, f"{cmd[0]} exited with {proc.returncode}"
        try:
            return httpx.get(health, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=300, every=0.5)
    return proc


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, str]]:
    engine_port, gateway_port = free_ports(2)
    engine = started(
        [
            SERVER,
            "-m",
            MODEL_FILE,
            "--alias",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(engine_port),
            "--metrics",
            "-c",
            "4096",
            "-np",
            "2",
            "-t",
            "2",
        ],
        f"http://127.0.0.1:{engine_port}/health",
    )
    engine_url = f"http://127.0.0.1:{engine_port}"
    gateway = started(
        [
            sys.executable,
            "-m",
            "edgeroute.cli",
            "serve",
            "--backend",
            engine_url,
            "--port",
            str(gateway_port),
        ],
        f"http://127.0.0.1:{gateway_port}/readyz",
        {"EDGEROUTE_ADMIN_TOKEN": TOKEN},
    )
    try:
        yield engine_url, f"http://127.0.0.1:{gateway_port}"
    finally:
        for proc in (gateway, engine):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_sdk_through_the_gateway_to_llama_cpp(stack: tuple[str, str]) -> None:
    _, gateway = stack
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0)
    assert MODEL in [m.id for m in client.models.list()]
    reply = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=16
    )
    assert reply.headers["x-edgeroute-backend"]
    answer = reply.parse()
    assert answer.choices[0].message.content and answer.usage is not None
    assert 0 < answer.usage.completion_tokens <= 16
    pieces = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=24,
            stream=True,
        )
        if chunk.choices
    ]
    assert len(pieces) > 2 and "".join(pieces).strip()
    text = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=8)
    assert text.choices[0].text


def test_the_gateway_reads_llama_cpps_load(stack: tuple[str, str]) -> None:
    _, gateway = stack
    admin = {"authorization": f"Bearer {TOKEN}"}

    def stats_age() -> float | None:
        (backend,) = httpx.get(gateway + "/admin/backends", headers=admin).json()["backends"]
        age: float | None = backend["stats_age_s"]
        return age

    wait_until(lambda: stats_age() is not None, timeout=30)


def _timed(url: str, i: int) -> tuple[float, float]:
    """(TTFT, end to end) of one streamed request, in seconds."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Write one sentence about the number {i}."}],
        "max_tokens": 32,
        "stream": True,
    }
    t0 = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                first = time.perf_counter() - t0
    assert first is not None
    return first, time.perf_counter() - t0


def test_a_short_benchmark_direct_and_through_the_gateway(stack: tuple[str, str]) -> None:
    engine, gateway = stack
    rows = []
    for name, url in (
        ("direct", engine),
        ("gateway", gateway),
        ("direct", engine),
        ("gateway", gateway),
    ):
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda i, u=url: _timed(u, i), range(12)))
        rows.append(
            (
                name,
                statistics.median(r[0] for r in results),
                statistics.median(r[1] for r in results),
            )
        )
    print("\n| path | TTFT p50 ms | end-to-end p50 ms |  (12 streams at concurrency 2, 32 tokens)")
    for name, ttft, e2e in rows:
        print(f"| {name} | {ttft * 1000:.0f} | {e2e * 1000:.0f} |")
