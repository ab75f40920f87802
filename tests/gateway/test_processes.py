"""`processes: N`: several gateway processes on one port act as replicas of one gateway."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml

from tests.support import GatewayProcess, WorkerProcess, wait_until


def test_processes_share_one_port_and_the_embedded_store(tmp_path: Path) -> None:
    workers = [WorkerProcess("--profile", "instant") for _ in range(2)]
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "processes": 2,
                "backends": [{"id": f"w{i}", "url": w.url} for i, w in enumerate(workers)],
            }
        )
    )
    gateway = GatewayProcess(config, {"EDGEROUTE_ADMIN_TOKEN": "procs-token"})
    admin = {"authorization": "Bearer procs-token"}
    try:
        # Both processes registered in the one store the parent started.
        wait_until(
            lambda: httpx.get(gateway.url + "/admin/status", headers=admin).json()["replicas"] == 2,
            timeout=10,
        )
        body = {"model": "instant", "messages": [{"role": "user", "content": "hi"}]}
        statuses = [
            httpx.post(gateway.url + "/v1/chat/completions", json=body).status_code
            for _ in range(40)
        ]
        assert statuses == [200] * 40
        # A backend added through one process is routed to by every process.
        extra = WorkerProcess("--profile", "instant")
        workers.append(extra)
        r = httpx.post(
            gateway.url + "/admin/backends", headers=admin, json={"id": "w2", "url": extra.url}
        )
        assert r.status_code == 201

        def everyone_knows() -> bool:
            ids = {
                frozenset(
                    b["id"]
                    for b in httpx.get(gateway.url + "/admin/backends", headers=admin).json()[
                        "backends"
                    ]
                )
                for _ in range(10)
            }
            return ids == {frozenset({"w0", "w1", "w2"})}

        wait_until(everyone_knows, timeout=10)
    finally:
        gateway.kill()
        for w in workers:
            w.kill()
