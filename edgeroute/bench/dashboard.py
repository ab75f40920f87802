"""`edgeroute bench dashboard`: the Grafana dashboard's panels, drawn from a real run.

It starts eight emulated workers (the six experts and two Prism MoE workers), one
gateway (`edgeroute serve`) and a real Prometheus (`prometheus` on PATH; Debian's
package will do) scraping the gateway every second. Clients then send chat traffic
through four phases (steady, twice the gateway's in-flight limit, one backend
answering 500, recovery) while an operator pushes congestion to the oracle. Then
Prometheus evaluates every panel's own PromQL over the run (`query_range`), and the
answers are drawn in the dashboard's layout with matplotlib. Grafana itself is not
run here: the picture is the dashboard's queries, evaluated by Prometheus.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import SecretStr

from edgeroute.bench.overhead import wait_ready
from edgeroute.results_io import output_dir, save_figure, save_text, write
from gateway.ports import free_ports
from policies.predictor import MODEL_ROOT
from workers.profiles import EXPERTS

ROOT = Path(__file__).resolve().parents[2]  # the repository
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "edgeroute.json"
WORKER_TOKEN = "dashboard-worker-token"
MAX_INFLIGHT = 48
SPEEDUP = 4.0


@dataclass(frozen=True)
class Phase:
    name: str
    share: float  # of the run
    clients: int
    fault: str = "none"  # on worker-2


PHASES = (
    Phase("steady", 0.25, 12),
    Phase("overload", 0.2, 4 * MAX_INFLIGHT),
    Phase("worker-2 answers 500", 0.25, 12, "error"),
    Phase("recovered", 0.3, 12),
)


# The two MoE workers: each hosts these experts of every layer.
MOE_WORKERS = (("moe-a", range(4)), ("moe-b", range(4, 8)))


def _serve_workers(configs: list[Any]) -> None:
    from gateway.serving import Listener, run, serve_apps
    from workers.server import Worker

    workers = [Worker(c) for c in configs]
    run(serve_apps([Listener(w.app, w.config.host, w.config.port) for w in workers]))


def _fleet(data_dir: Path, ports: Iterator[int]) -> tuple[list[Any], list[dict[str, Any]]]:
    """Worker configs and the gateway's backend entries for them."""
    from workers.moe_host import MoEConfig
    from workers.server import WorkerConfig

    configs: list[Any] = []
    backends: list[dict[str, Any]] = []
    for i, profile in enumerate(EXPERTS, start=1):
        port = next(ports)
        configs.append(
            WorkerConfig(
                profile=profile,
                served_model_names=[profile, "edge", "edge-qos"],
                port=port,
                speedup=SPEEDUP,
                data_dir=data_dir,
                enable_faults=True,
                admin_token=SecretStr(WORKER_TOKEN),
            )
        )
        backends.append({"id": f"worker-{i}", "url": f"http://127.0.0.1:{port}"})
    for name, experts in MOE_WORKERS:
        port = next(ports)
        configs.append(
            WorkerConfig(
                profile="mixtral-8x7b-chat",
                served_model_names=["moe"],
                port=port,
                speedup=SPEEDUP,
                data_dir=data_dir,
                moe=MoEConfig(hosted=[(la, e) for la in range(32) for e in experts]),
                admin_token=SecretStr(WORKER_TOKEN),
            )
        )
        backends.append(
            {
                "id": name,
                "url": f"http://127.0.0.1:{port}",
                "moe": {
                    "gpu_memory_gb": [160 * 0.35],
                    "expert_gb": 0.35,
                    "io_gbps": [50.0],
                    "admin_token": WORKER_TOKEN,
                },
            }
        )
    return configs, backends


def _gateway_config(backends: list[dict[str, Any]], port: int) -> dict[str, Any]:
    experts = [b["id"] for b in backends if "moe" not in b]
    return {
        "host": "127.0.0.1",
        "port": port,
        "max_inflight": MAX_INFLIGHT,
        "prism_replan_seconds": 60,
        "routing": {
            "default": {"policy": "cla"},
            # RouterBench's agent: these workers serve its predictor's models
            "models": {
                "edge-qos": {"policy": "qos_drl", "model": str(MODEL_ROOT)},
                "moe": {"policy": "prism"},
            },
        },
        "backends": backends,
        "oracle": {
            "instances": {
                b: {"node": f"n{i}", "rack": f"r{i // 2}", "pod": f"p{i // 4}"}
                for i, b in enumerate(experts)
            }
        },
    }


def _request(rng: random.Random) -> tuple[dict[str, Any], dict[str, str]]:
    kind = rng.random()
    prompt = rng.choice(
        ["Write a function that merges two sorted lists.", "What is 17 * 23?", "Tell me a story."]
    )
    body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 48}
    if kind < 0.55:
        return {**body, "model": "edge", "stream": rng.random() < 0.5}, {}
    if kind < 0.8:
        return {**body, "model": "edge-qos", "stream": True}, {}
    return {**body, "model": "moe"}, {"x-edgeroute-task": rng.choice(["gsm8k", "humaneval"])}


async def _client(
    client: httpx.AsyncClient, url: str, stop: asyncio.Event, tally: Counter[str], seed: int
) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        body, headers = _request(rng)
        try:
            async with client.stream(
                "POST", url + "/v1/chat/completions", json=body, headers=headers
            ) as r:
                async for _ in r.aiter_bytes():
                    pass
                tally[str(r.status_code)] += 1
        except httpx.HTTPError as exc:
            tally[type(exc).__name__] += 1
        await asyncio.sleep(rng.expovariate(5.0))


async def _drive(
    gateway: str, fault_url: str, admin: dict[str, str], seconds: float
) -> list[dict[str, Any]]:
    rows = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
        t_start = time.monotonic()

        async def congestion(stop: asyncio.Event) -> None:
            while not stop.is_set():
                t = time.monotonic() - t_start
                rho = {"rack": 0.5 + 0.4 * math.sin(t / 30), "pod": 0.3 + 0.2 * math.cos(t / 45)}
                await client.put(gateway + "/admin/oracle/congestion", json=rho, headers=admin)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 5.0)

        done = asyncio.Event()
        worker_admin = {"authorization": f"Bearer {WORKER_TOKEN}"}
        pusher = asyncio.create_task(congestion(done))
        for n, phase in enumerate(PHASES):
            await client.post(
                fault_url + "/admin/fault", json={"mode": phase.fault}, headers=worker_admin
            )
            tally: Counter[str] = Counter()
            stop = asyncio.Event()
            tasks = [
                asyncio.create_task(_client(client, gateway, stop, tally, 1000 * n + i))
                for i in range(phase.clients)
            ]
            length = phase.share * seconds
            t0 = time.monotonic()
            while (left := t0 + length - time.monotonic()) > 0:
                await asyncio.sleep(min(10.0, left))
                print(
                    f"  [{time.monotonic() - t_start:5.0f} s] {phase.name}: {dict(tally)}",
                    flush=True,
                )
            stop.set()
            await asyncio.gather(*tasks)
            rows.append({"phase": phase.name, "clients": phase.clients, **tally})
        done.set()
        await pusher
        await client.post(fault_url + "/admin/fault", json={"mode": "none"}, headers=worker_admin)
    return rows


def _query(prom: str, start: float, end: float) -> list[dict[str, Any]]:
    """Every panel's targets, evaluated by Prometheus over [start, end]."""
    board = json.loads(DASHBOARD.read_text())
    panels = []
    for p in board["panels"]:
        targets = []
        for t in p["targets"]:
            r = httpx.get(
                prom + "/api/v1/query_range",
                params={"query": t["expr"], "start": start, "end": end, "step": 2},
                timeout=30,
            )
            r.raise_for_status()
            series = [
                {
                    "labels": s["metric"],
                    "t": [float(x) - start for x, _ in s["values"]],
                    "v": [float(v) for _, v in s["values"]],
                }
                for s in r.json()["data"]["result"]
            ]
            targets.append(
                {"expr": t["expr"], "legend": t.get("legendFormat", ""), "series": series}
            )
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        panels.append({"title": p["title"], "type": p["type"], "unit": unit, "targets": targets})
    return panels


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's `{{label}}` legend format; without one, the label set."""
    if fmt:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"


def render(panels: list[dict[str, Any]], phases: list[tuple[str, float]], out: Path) -> None:
    """Draw the panels in a grid; `phases` are (name, start second) markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = math.ceil(len(panels) / cols)
    plt.style.use("dark_background")
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        ax.set_title(panel["title"], fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        lines = 0
        for target in panel["targets"]:
            for s in target["series"]:
                label = legend(target["legend"], s["labels"])
                if panel["type"] == "stat":
                    lines += 1
                    last = s["v"][-1] if s["v"] else float("nan")
                    ax.text(0.05, 1.0 - 0.35 * lines, f"{label}: {last:g}", fontsize=16)
                    continue
                ax.plot(s["t"], s["v"], linewidth=1, label=label)
                lines += 1
        if panel["type"] == "stat":
            ax.axis("off")
            continue
        for _name, start in phases:
            ax.axvline(start, color="grey", linestyle=":", linewidth=0.8)
        if panel["unit"]:
            ax.set_ylabel(panel["unit"], fontsize=7)
        if lines == 0:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        elif lines <= 8:
            ax.legend(fontsize=6, loc="upper left")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    names = ", ".join(f"{name} from {start:.0f} s" for name, start in phases)
    fig.suptitle(f"edgeroute dashboard, evaluated by Prometheus over a recorded run ({names})")
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    save_figure(fig, out, dpi=80)
    plt.close(fig)


def main(quick: bool, seconds: float, json_path: str | None, data_dir: Path | None) -> None:
    from workers.quality import default_data_dir

    prometheus = shutil.which("prometheus")
    if prometheus is None:
        sys.exit("needs `prometheus` on PATH (for example: apt-get install prometheus)")
    data = data_dir or default_data_dir()
    if not data.exists():
        sys.exit(f"needs the data folder (MoE routing and quality data): {data}")
    seconds = 60.0 if quick else seconds
    token = secrets.token_urlsafe(16)
    admin = {"authorization": f"Bearer {token}"}
    # every port at once, so that none is handed out twice
    gw_port, prom_port, *worker_ports = free_ports(2 + len(EXPERTS) + len(MOE_WORKERS))
    configs, backends = _fleet(data, iter(worker_ports))
    gateway = f"http://127.0.0.1:{gw_port}"
    prom = f"http://127.0.0.1:{prom_port}"
    procs: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        workers = multiprocessing.get_context("spawn").Process(
            target=_serve_workers, args=(configs,), daemon=True
        )
        workers.start()
        procs.append(workers)
        try:
            for b in backends:
                wait_ready(b["url"] + "/health", 60.0)
            (Path(tmp) / "gateway.yaml").write_text(
                yaml.safe_dump(_gateway_config(backends, gw_port))
            )
            said = stack.enter_context(tempfile.TemporaryFile())  # quoted if it exits
            gw = subprocess.Popen(
                [sys.executable, "-m", "edgeroute.cli", "serve", "--config", f"{tmp}/gateway.yaml"],
                env={
                    **os.environ,
                    "EDGEROUTE_ADMIN_TOKEN": token,
                    "EDGEROUTE_LOG_LEVEL": "WARNING",
                },
                stdout=subprocess.DEVNULL,
                stderr=said,
            )
            procs.append(gw)
            wait_ready(gateway + "/readyz", 60.0, gw, said)
            scrape = {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "edgeroute-gateway",
                        "static_configs": [{"targets": [gateway[7:]]}],
                    }
                ],
            }
            (Path(tmp) / "prometheus.yml").write_text(yaml.safe_dump(scrape))
            said = stack.enter_context(tempfile.TemporaryFile())
            server = subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={tmp}/prometheus.yml",
                    f"--storage.tsdb.path={tmp}/tsdb",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=said,
            )
            procs.append(server)
            wait_ready(prom + "/-/ready", 60.0, server, said)
            print(f"gateway {gateway}, Prometheus {prom}; {seconds:.0f} s of traffic", flush=True)
            start = time.time()
            fault_url = next(b["url"] for b in backends if b["id"] == "worker-2")
            rows = asyncio.run(_drive(gateway, fault_url, admin, seconds))
            time.sleep(3)  # the last scrapes
            end = time.time()
            panels = _query(prom, start, end)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                if isinstance(p, subprocess.Popen):
                    p.wait(10)
                else:
                    p.join(10)
    marks, at = [], 0.0
    for phase in PHASES:
        marks.append((phase.name, at))
        at += phase.share * seconds
    out = output_dir(quick)
    render(panels, marks, out / "dashboard.png")
    recorded = {"phases": marks, "seconds": seconds, "panels": panels}
    save_text(out / "dashboard-series.json", json.dumps(recorded) + "\n")
    columns = ["phase", "clients", *sorted({k for r in rows for k in r} - {"phase", "clients"})]
    write(
        "dashboard",
        {"command": f"edgeroute bench dashboard --seconds {seconds:g}", "seconds": seconds},
        rows,
        columns,
        json_path,
        notes=(
            "Responses by status per phase, as the clients saw them. The picture is "
            "`dashboard.png`: every panel's PromQL evaluated by Prometheus "
            f"{_prometheus_version(prometheus)} over this run, drawn with matplotlib "
            "(Grafana was not run); the series are in `dashboard-series.json`."
        ),
        quick=quick,
    )


def _prometheus_version(binary: str) -> str:
    first = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"version (\S+)", first)
    return found.group(1) if found else "(unknown version)"
