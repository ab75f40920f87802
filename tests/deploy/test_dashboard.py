"""The Grafana dashboard queries only what the gateway exports."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "edgeroute.json"


def queried() -> set[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    return set(re.findall(r"edgeroute_[a-z_]+", " ".join(exprs)))


def test_every_metric_the_dashboard_queries_is_exported(
    start_worker: Callable[..., tuple[str, Any]], start_gateway: Callable[..., tuple[str, Any]]
) -> None:
    worker, _ = start_worker(speedup=50.0)
    url, _ = start_gateway([{"url": worker, "id": "w"}])
    r = httpx.post(
        url + "/v1/chat/completions",
        timeout=30,
        json={"model": "mistral-7b-chat", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200
    exported = dict(
        re.findall(r"^# TYPE (\S+) (\S+)$", httpx.get(url + "/metrics").text, re.MULTILINE)
    )
    names = queried()
    assert len(names) >= 15
    for name in names:
        if name in exported:  # gauges, and counters (exposed with `_total`)
            assert not name.endswith("_total") or exported[name] == "counter", name
            continue
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert exported.get(base) == "histogram", f"{name}: the gateway exports no {base}"


def test_panels_are_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "prometheus"  # the provisioned datasource
        assert p["targets"] and all(t["expr"] for t in p["targets"])
