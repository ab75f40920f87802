"""docker-compose.yml, the Dockerfile and their configs, checked without a Docker engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from gateway.settings import load_settings
from tests.support import GatewayProcess, RedisProcess, WorkerProcess, sample
from workers.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]
PD_POOL = ("prefill-1", "decode-1", "decode-2")  # the optional `pd` profile


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
    assert targets == {s for s in services if s.startswith(("gateway-", "worker-"))} | set(PD_POOL)


def test_dockerfile_runs_as_non_root_with_a_healthcheck_and_the_models() -> None:
    lines = [x.strip() for x in (ROOT / "Dockerfile").read_text().splitlines()]
    assert any(x.startswith("USER ") and x.split()[1] not in ("root", "0") for x in lines)
    assert any(x.startswith("HEALTHCHECK ") for x in lines)
    assert "COPY models models" in lines
    for package in ("gateway", "policies", "oracle", "workers"):
        assert f"COPY {package} {package}" in lines


def test_the_optional_pd_pool_is_behind_a_profile_and_in_its_gateway_config() -> None:
    services = compose()["services"]
    for name in PD_POOL:
        assert services[name]["profiles"] == ["pd"]
    settings = load_settings(ROOT / "deploy" / "gateway-pd.yaml")
    roles = {b.backend_id: b.role for b in settings.backends}
    for name in PD_POOL:
        command = services[name]["command"]
        assert roles[name] == command[command.index("--role") + 1]
    assert settings.oracle is not None and set(settings.oracle.instances) == set(PD_POOL)
    assert settings.routing.decode.policy == "netkv_full"


def test_the_pd_pool_as_composed_serves_its_model(tmp_path: Path) -> None:
    """The pool's compose commands and gateway config, run on loopback: a request for
    the pool's model is prefilled on prefill-1 and decoded on a decode instance."""
    services = compose()["services"]
    redis = RedisProcess()
    redis.start()
    workers: dict[str, WorkerProcess] = {}
    gateway: GatewayProcess | None = None
    try:
        for name in PD_POOL:
            args = list(services[name]["command"][1:])  # after `worker`
            args[args.index("--host") + 1] = "127.0.0.1"
            args[args.index("--redis-url") + 1] = redis.url
            workers[name] = WorkerProcess(*args)  # its --port comes last and wins
        config = yaml.safe_load((ROOT / "deploy" / "gateway-pd.yaml").read_text())
        config["backends"] = [b for b in config["backends"] if b["id"] in workers]
        for b in config["backends"]:
            b["url"] = workers[b["id"]].url
        config["host"] = "127.0.0.1"
        (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
        gateway = GatewayProcess(
            tmp_path / "gateway.yaml",
            {"EDGEROUTE_ADMIN_TOKEN": "pd-token", "EDGEROUTE_REDIS_URL": redis.url},
        )
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused")
        raw = client.chat.completions.with_raw_response.create(
            model="mistral-7b-pd",
            max_tokens=8,
            messages=[{"role": "user", "content": "Tell me about disaggregated serving."}],
        )
        answer = raw.parse()
        assert answer.choices[0].message.content
        assert raw.headers["x-edgeroute-backend"] in ("decode-1", "decode-2")
        metrics = httpx.get(gateway.url + "/metrics").text
        assert sample(metrics, "edgeroute_pd_requests_total", prefill="prefill-1") == 1
    finally:
        if gateway is not None:
            gateway.kill()
        for w in workers.values():
            w.kill()
        redis.kill()
