"""The Helm chart, linted and rendered by Helm's own engine (helm-python-sdk embeds its
Go library), with every manifest validated against the Kubernetes schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from gateway.settings import Settings

CHART = Path(__file__).resolve().parents[2] / "helm" / "edgeroute"
KUBE = "1.30"
DEFAULT: dict[str, Any] = {"auth": {"adminToken": "t0ken"}}
EXTERNAL: dict[str, Any] = {
    "auth": {"adminToken": "t0ken", "apiKeys": ["k1", "k2"]},
    "redis": {"enabled": False, "externalUrl": "redis://redis.prod:6379/0"},
    "autoscaling": {"enabled": False},
    "gateway": {"replicas": 3, "backends": [{"url": "http://vllm-0:8000", "id": "vllm-0"}]},
    "workers": {"enabled": True},
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(CHART)
    files = chart.render(values, name="er", namespace="llm")
    return [d for text in files.values() for d in yaml.safe_load_all(text) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("values", [DEFAULT, EXTERNAL], ids=["default", "external-redis-3"])
def test_chart_lints_renders_and_validates(values: dict[str, Any]) -> None:
    report = helm_python.lint(CHART, values, strict=False)
    assert report["errors"] == [] and all(m["severity"] < 3 for m in report["messages"])
    docs = render(values)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE, strict=True)


def test_default_values_run_redis_in_the_chart_with_autoscaling() -> None:
    docs = render(DEFAULT)
    assert len(by_kind(docs, "StatefulSet")) == 1
    assert len(by_kind(docs, "HorizontalPodAutoscaler")) == 1
    assert len(by_kind(docs, "PodDisruptionBudget")) == 1
    (gateway,) = by_kind(docs, "Deployment")
    env = {e["name"]: e for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["EDGEROUTE_REDIS_URL"]["value"] == "redis://er-edgeroute-redis:6379/0"
    assert env["EDGEROUTE_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "admin-token"
    assert "ServiceMonitor" not in {d["kind"] for d in docs}


def test_external_redis_three_replicas_and_demo_workers() -> None:
    docs = render(EXTERNAL)
    assert not by_kind(docs, "StatefulSet") and not by_kind(docs, "HorizontalPodAutoscaler")
    deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    gateway = deployments.pop("er-edgeroute")
    assert gateway["spec"]["replicas"] == 3
    env = {e["name"]: e for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["EDGEROUTE_REDIS_URL"]["value"] == "redis://redis.prod:6379/0"
    assert len(deployments) == 3  # one per demo worker profile
    # The ConfigMap is a settings file the gateway itself accepts.
    (config,) = by_kind(docs, "ConfigMap")
    settings = Settings(**yaml.safe_load(config["data"]["gateway.yaml"]))
    urls = [b.url for b in settings.backends]
    assert urls[0] == "http://vllm-0:8000" and "http://er-edgeroute-worker-2:8100" in urls
    (secret,) = by_kind(docs, "Secret")
    assert yaml.safe_load(secret["stringData"]["api-keys"]) == ["k1", "k2"]


def test_service_monitor_when_asked() -> None:
    docs = render({**DEFAULT, "serviceMonitor": {"enabled": True}})
    (monitor,) = by_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_bad_values_are_refused_by_the_schema() -> None:
    with pytest.raises(helm_python.HelmError):
        render({**DEFAULT, "gateway": {"replicas": "three"}})
    with pytest.raises(helm_python.HelmError):
        render({"auth": {"adminToken": ""}})  # no token and no existing secret
    with pytest.raises(helm_python.HelmError):
        render({**DEFAULT, "redis": {"enabled": False}})  # and no external URL
