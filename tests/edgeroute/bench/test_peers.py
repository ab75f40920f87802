"""The gateway's target file for the shared peers harness starts a working gateway."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from edgeroute.bench.peers import target_files
from gateway.ports import free_ports
from tests.support import WorkerProcess, wait_until


def test_a_policy_target_starts_the_gateway_in_front_of_the_harness_backends(
    tmp_path: Path,
) -> None:
    workers = [
        WorkerProcess("--profile", "instant", "--served-model-name", "mock-model") for _ in range(2)
    ]
    port = free_ports(1)[0]
    first, second = target_files(["least_load", "cla"], tmp_path, first_port=port)
    assert "EDGEROUTE_NAME=edgeroute-cla" in second.read_text()
    env = {
        **os.environ,
        "EDGEROUTE_PY": sys.executable,
        "BACKEND_URLS": " ".join(w.url for w in workers),
        "MODEL": "mock-model",
        "RUN_DIR": str(tmp_path),
    }
    # As run_all.sh starts a target: source the file, then target_start (which execs).
    log = (tmp_path / "gateway.log").open("w")
    gateway = subprocess.Popen(
        ["bash", "-c", 'source "$1"; target_start', "_", str(first)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            try:
                return httpx.get(url + "/readyz", timeout=0.5).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(ready, timeout=30)
        except AssertionError:
            raise AssertionError((tmp_path / "gateway.log").read_text()) from None
        # Both harness backends take traffic. One request at a time finds both idle, and
        # least_load breaks that tie at random: four tries missed one backend 1 time in
        # 8, so it sends until both have answered (64 tries miss with odds of 2**-63).
        seen = set()
        for _ in range(64):
            r = httpx.post(
                url + "/v1/chat/completions",
                json={"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert r.status_code == 200, r.text
            seen.add(r.headers["x-edgeroute-backend"])
            if len(seen) == 2:
                break
        assert len(seen) == 2
        assert "policy: least_load" in (tmp_path / "gateway.yaml").read_text()
    finally:
        os.killpg(gateway.pid, signal.SIGTERM)
        gateway.wait(15)
        for w in workers:
            w.kill()
