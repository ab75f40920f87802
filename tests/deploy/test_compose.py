"""docker-compose.yml, the Dockerfile and their configs, checked without a Docker engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gateway.settings import load_settings
from workers.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    """Validate against the official Compose Specification schema, as vendored by
    check-jsonschema."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(path),
        ],
        capture_output=True,
        text=True,
    )


def test_compose_file_follows_the_compose_specification() -> None:
    run = check_compose(ROOT / "docker-compose.yml")
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_schema_check_rejects_a_broken_file(tmp_path: Path) -> None:
    broken = (
        (ROOT / "docker-compose.yml").read_text().replace('ports: ["8001:8000"]', "ports: 8001")
    )
    (tmp_path / "docker-compose.yml").write_text(broken)
    run = check_compose(tmp_path / "docker-compose.yml")
    assert run.returncode != 0


def test_two_gateways_one_redis_six_different_workers() -> None:
    services = compose()["services"]
    gateways = [s for s in services if s.startswith("gateway-")]
    workers = {s: services[s] for s in services if s.startswith("worker-")}
    assert len(gateways) == 2 and "redis" in services
    profiles = [w["command"][w["command"].index("--profile") + 1] for w in workers.values()]
    assert len(workers) == 6 and len(set(profiles)) == 6
    assert set(profiles) <= set(PROFILES)
    for g in gateways:
        env = services[g]["environment"]
        assert env["EDGEROUTE_REDIS_URL"].startswith("redis://redis:")
        assert "EDGEROUTE_ADMIN_TOKEN" in env  # from the operator's environment


def test_gateway_config_loads_and_names_every_worker() -> None:
    settings = load_settings(ROOT / "deploy" / "gateway.yaml")
    assert settings.admin_token is None and settings.redis_url is None  # env supplies them
    hosts = {b.url.split("//")[1].split(":")[0] for b in settings.backends}
    assert hosts == {s for s in compose()["services"] if s.startswith("worker-")}


def test_prometheus_scrapes_every_gateway_and_worker() -> None:
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = {
        t.split(":")[0]
        for job in prom["scrape_configs"]
        for sc in job["static_configs"]
        for t in sc["targets"]
    }
    services = compose()["services"]
    assert targets == {s for s in services if s.startswith(("gateway-", "worker-"))}


def test_dockerfile_runs_as_non_root_with_a_healthcheck_and_the_models() -> None:
    lines = [x.strip() for x in (ROOT / "Dockerfile").read_text().splitlines()]
    assert any(x.startswith("USER ") and x.split()[1] not in ("root", "0") for x in lines)
    assert any(x.startswith("HEALTHCHECK ") for x in lines)
    assert "COPY models models" in lines
    for package in ("gateway", "policies", "oracle", "workers"):
        assert f"COPY {package} {package}" in lines
