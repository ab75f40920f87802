"""The README's quickstart and admin API blocks, run as written against a real demo.

The demo is started as `make demo` starts it (`edgeroute demo`), with the admin token
the quickstart exports, on free ports: the blocks' `localhost:8000` is the one thing
changed. Every shell block runs in bash with `set -euo pipefail`, every Python block
in this interpreter; each must exit 0 and print no error.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.ports import free_ports
from gateway.serving import PortInUse, check_ports
from tests.support import wait_until

README = Path(__file__).resolve().parents[1] / "README.md"
WORKERS = 4


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"```(bash|python)\n(.*?)```", text, re.S)


def free_run(count: int) -> int:
    """The first of `count` consecutive free ports."""
    while True:
        first = free_ports(1)[0]
        try:
            check_ports("127.0.0.1", range(first, first + count))
            return first
        except PortInUse:
            continue


@pytest.fixture(scope="module")
def demo() -> Iterator[tuple[int, dict[str, str]]]:
    quickstart = section(README.read_text(), "Quickstart")
    exported = dict(re.findall(r"^export (\w+)=(\S+)$", quickstart, re.M))
    assert "EDGEROUTE_ADMIN_TOKEN" in exported, "the quickstart exports the admin token"
    env = {**os.environ, **exported}
    # one run for the gateway and its workers: two draws could hand out one port twice
    port = free_run(WORKERS + 1)
    workers = port + 1
    args = ["--port", str(port), "--worker-port", str(workers), "--workers", str(WORKERS)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeroute.cli", "demo", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )

    def ready() -> bool:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
            return r.status_code == 200 and r.json()["healthy_backends"] == WORKERS
        except httpx.HTTPError:
            return False

    wait_until(ready, timeout=60)
    try:
        yield port, env
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_blocks(title: str, port: int, env: dict[str, str]) -> list[str]:
    outputs = []
    for lang, code in blocks(section(README.read_text(), title)):
        if "make demo" in code:
            continue  # what the fixture did
        code = code.replace("localhost:8000", f"localhost:{port}")
        if lang == "bash":
            cmd = ["bash", "-c", "set -euo pipefail\n" + code]
        else:
            cmd = [sys.executable, "-c", code]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (code, r.stdout, r.stderr)
        assert '"error"' not in r.stdout, (code, r.stdout)
        outputs.append(r.stdout)
    return outputs


def test_the_quickstart_runs_as_written(demo: tuple[int, dict[str, str]]) -> None:
    port, env = demo
    curl, sdk = run_blocks("Quickstart", port, env)
    assert '"chat.completion"' in curl and "data: [DONE]" in curl and '"edge-llm"' in curl
    assert sdk.strip()  # the SDK printed the reply and the stream


def test_the_admin_examples_run_as_written(demo: tuple[int, dict[str, str]]) -> None:
    port, env = demo
    (out,) = run_blocks("Admin API", port, env)
    assert '"id":"worker-0"' in out.replace(" ", "")
    assert '"draining":true' in out.replace(" ", "")  # the drain answered
    routing = httpx.get(
        f"http://127.0.0.1:{port}/admin/routing",
        headers={"authorization": f"Bearer {env['EDGEROUTE_ADMIN_TOKEN']}"},
    ).json()
    assert routing["default"]["policy"] == "power_of_two"  # the PUT took effect
