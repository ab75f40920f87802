"""`edgeroute bench live`: routers side by side on live traffic, same workers, same trace.

Each router runs as its own process in front of a pool of emulated workers (one of
`live_pools.POOLS`: heterogeneous engines, quality experts, MoE workers, or a
prefill/decode pool), started afresh for every run so that no router inherits
another's caches or queues. A trace (any Mooncake JSONL, Azure CSV or RouterBench
prompt-set file) is replayed at its own arrival times, compressed or stretched to a
load level, `--speedup` times faster than real time on both sides: the workers run
their clocks that much faster and the client sends that much sooner. Every request is
a streamed chat completion whose prompt is built from the trace's block hashes (the
same hash, the same text: prefix caches hit as they would) and whose `max_tokens`,
with vLLM's `ignore_eos`, is the trace's output length; a prompt set's real prompts are
sent as they are and answered at the model's own length.

Load levels are fractions of the pool's capacity, measured first in the same run: the
completions per second of a closed loop that keeps every worker's KV memory busy.

Per request: TTFT, mean inter-token latency, end to end, and the outcome: served,
refused (the worker it was sent to cannot hold it: context or KV memory; a request
no worker can hold is `unservable` and counted apart), or failed. Per run: goodput
(served requests meeting both SLOs, per second), SLO attainment, the workers'
prefix-cache hit rate, load imbalance (coefficient of variation of requests per
worker), the router's CPU per request, and the workers' worst lag behind their
clocks (the time-scaling error). On the experts pool also the answers' mean quality
score and QoS (score times [mean inter-token latency <= the TPOT SLO], 0 for a shed
or failed request), as in the QoS paper's eq. 1. Intervals are 95% over seeds; the seed moves the
arrival jitter, the trace stays the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import yaml

from edgeroute.bench.live_pools import ADMIN_TOKEN, MODEL, POOLS, Pool
from edgeroute.bench.loadgen import cpu_seconds, until
from edgeroute.bench.operator import operate
from edgeroute.bench.overhead import wait_ready
from edgeroute.results_io import Plot, draw, output_dir, save_figure, write
from edgeroute.sim.workload import TraceRequest, prompt_for, read_trace
from edgeroute.stats import interval
from gateway.ports import free_ports
from gateway.promtext import read_samples
from policies.predictor import MODEL_ROOT
from workers.profiles import PROFILES

PEERS = Path(os.environ.get("PEERS", "/tmp/peers"))
# Requests outside the trace's own traffic must not reach the internet (sglang-router
# tries to fetch a tokenizer): proxies point at a closed local port.
OFFLINE = {
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "HF_ENDPOINT": "http://127.0.0.1:9",
    "HF_HUB_OFFLINE": "1",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


WHOLE = frozenset({"mixed", "experts", "moe"})  # pools that serve whole requests


@dataclass(frozen=True)
class Router:
    """One router under test: ours with a routing spec, or a peer with its policy."""

    name: str
    kind: str  # "edgeroute", "vllm-router" or "sglang-router"
    policy: Any  # edgeroute: a routing spec (mapping); a peer: its --policy
    pools: frozenset[str] = WHOLE  # the pools it can route
    slot: str = "default"  # edgeroute: which routing entry the spec fills


# The llm-d endpoint picker's default profile (queue 2, KV utilisation 2, prefix 3,
# max-score picker), re-created with our scorers: not llm-d itself.
LLM_D = {
    "policy": "least_load",
    "scorers": [
        {"type": "queue", "weight": 2.0},
        {"type": "kv_utilization", "weight": 2.0},
        {"type": "prefix_cache", "weight": 3.0},
    ],
    "tie_epsilon": 0.0,
}
# Ours, in no paper: where the prompt's prefix is cached, unless that backend is busier
# (the load scorer sees the engine's queue and our own in-flight count) or short of KV.
COMPOSED = {
    "policy": "least_load",
    "scorers": [
        {"type": "prefix_cache", "weight": 0.5},
        {"type": "load", "weight": 0.35},
        {"type": "kv_utilization", "weight": 0.15},
    ],
}
ROUTERS = {
    r.name: r
    for r in (
        Router("round_robin", "edgeroute", {"policy": "round_robin"}),
        Router("least_load", "edgeroute", {"policy": "least_load"}),
        Router("power_of_two", "edgeroute", {"policy": "power_of_two"}),
        Router("prefix_cache", "edgeroute", {"policy": "prefix_cache"}),
        Router("cla", "edgeroute", {"policy": "cla"}),
        Router("composed", "edgeroute", COMPOSED),
        Router("llm-d default (re-created)", "edgeroute", LLM_D),
        Router("vllm-router round_robin", "vllm-router", "round_robin"),
        Router("vllm-router power_of_two", "vllm-router", "power_of_two"),
        Router("vllm-router cache_aware", "vllm-router", "cache_aware"),
        Router("sglang-router cache_aware", "sglang-router", "cache_aware"),
        # RouterBench's agent: its predictor knows this pool's models (the default
        # agent's knows RouterDC's open models, and would predict the mean of all here)
        Router(
            "qos_drl",
            "edgeroute",
            {"policy": "qos_drl", "model": str(MODEL_ROOT)},
            frozenset({"experts"}),
        ),
        Router("prism", "edgeroute", {"policy": "prism"}, frozenset({"moe"})),
        *(
            Router(name, "edgeroute", {"policy": name}, frozenset({"pd", "pd-net"}), "decode")
            for name in ("netkv_full", "decode_rr", "decode_la", "decode_cla")
        ),
        *(
            Router(f"vllm-router pd {p}", "vllm-router", p, frozenset({"pd", "pd-net"}))
            for p in ("round_robin", "power_of_two", "cache_aware")
        ),
    )
}


@dataclass(frozen=True)
class Settings:
    trace: Path
    routers: tuple[str, ...]
    loads: tuple[float, ...]  # fractions of the measured capacity
    seeds: tuple[int, ...]
    seconds: float  # emulated seconds of arrivals per run
    speedup: float
    ttft_slo: float  # emulated seconds
    tpot_slo: float
    pool: str = "mixed"
    capacity: float | None = None  # completions/s to take as 100%; None: measure it
    data_dir: Path | None = None  # the quality data, for the experts and MoE pools

    @property
    def workers(self) -> Pool:
        return POOLS[self.pool]


@dataclass
class Result:
    """One request as the client saw it (times in emulated seconds)."""

    status: str  # "ok", "refused", "unservable", "shed" (429/503) or "failed"
    ttft: float = math.nan
    itl: float = math.nan
    e2e: float = math.nan
    tokens: int = 0
    detail: str = ""
    score: float = math.nan  # the worker's emulated quality score, when it has one


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`cmd` in a session of its own, its stderr to `log` (read back if it fails)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=out,
            env={**os.environ, **OFFLINE},
            start_new_session=True,
        )


def _ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until `url` answers; a server that exits first fails with its last words."""
    with log.open("rb") as said:
        wait_ready(url, 60.0, proc, said)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def workers(kind: Pool, speedup: float, data_dir: Path | None, seed: int) -> Iterator[list[str]]:
    """Fresh workers, one process each; yields their URLs."""
    ports = free_ports(len(kind.members))
    with tempfile.TemporaryDirectory() as tmp:
        logs = [Path(tmp) / f"worker-{i}.log" for i in range(len(ports))]
        procs = [
            _spawn(kind.worker_command(i, port, speedup, Path(tmp), data_dir, seed), log)
            for (i, port), log in zip(enumerate(ports), logs, strict=True)
        ]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        try:
            for url, proc, log in zip(urls, procs, logs, strict=True):
                _ready(url + "/health", proc, log)
            yield urls
        finally:
            for proc in procs:
                _stop(proc)


def router_command(
    router: Router, kind: Pool, urls: list[str], port: int, folder: Path
) -> list[str]:
    if router.kind == "edgeroute":
        config = folder / "gateway.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "backends": kind.backends(urls),
                    "routing": {router.slot: router.policy},
                    "log_level": "WARNING",
                    "max_inflight": 0,
                    "timeouts": {"first_byte": 600, "response": 600, "idle": 120},
                    **kind.gateway_settings(),
                }
            )
        )
        return [
            sys.executable,
            "-m",
            "edgeroute.cli",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
        ]
    binary = {
        "vllm-router": PEERS / "vllm-router" / "bin" / "vllm-router",
        "sglang-router": PEERS / "sglang-router" / "bin" / "smg",
    }[router.kind]
    if not binary.exists():
        raise FileNotFoundError(f"{binary} (install the peers: ../shared/bench-peers/setup.sh)")
    prometheus = str(free_ports(1)[0])
    head = [str(binary)] if router.kind == "vllm-router" else [str(binary), "launch"]
    return [
        *head,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *kind.peer_workers(urls, router.kind),
        "--policy",
        str(router.policy),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        prometheus,
    ]


def gateway_clock(spec: Any, tpot_slo: float, speedup: float) -> Any:
    """A routing spec for a time-scaled run: the gateway lives in real time, where
    every latency is `speedup` times shorter than the emulated one, so `qos_drl`'s
    target L (s per token) shrinks with it."""
    if isinstance(spec, dict) and spec.get("policy") == "qos_drl":
        return {**spec, "latency_ms": tpot_slo * 1000 / speedup}
    return spec


@contextmanager
def running(router: Router, kind: Pool, urls: list[str]) -> Iterator[tuple[str, int]]:
    """The router in front of `urls`; yields its URL and process id."""
    port = free_ports(1)[0]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "router.log"
        proc = _spawn(router_command(router, kind, urls, port, Path(tmp)), log)
        url = f"http://127.0.0.1:{port}"
        try:
            health = "/readyz" if router.kind == "edgeroute" else "/health"
            _ready(url + health, proc, log)
            yield url, proc.pid
        finally:
            _stop(proc)


def fits(req: TraceRequest, profiles: Sequence[str]) -> bool:
    """Can any worker of the pool hold this request (context and KV memory)?"""
    need = req.input_len + max(1, req.output_len)
    for name in profiles:
        p = PROFILES[name]
        if need <= p.max_model_len and p.blocks_for(need) <= p.kv_blocks:
            return True
    return False


def body_for(req: TraceRequest, index: int, kind: Pool) -> dict[str, Any]:
    """The request as sent: the trace's own prompt, or one built from its blocks with
    the trace's output length; on a pool with task classes, the class (in OpenAI's
    `metadata`, which every router forwards)."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": req.prompt or prompt_for(req, index)}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if req.output_len > 0:
        body["max_tokens"] = req.output_len
        body["ignore_eos"] = True
    if kind.tasks:
        body["metadata"] = {"task": task_of(index, kind)}
    return body


def task_of(index: int, kind: Pool) -> str:
    """The class of the trace's `index`th request: fixed by the index, not the seed."""
    return random.Random(index).choice(kind.tasks)


def headers_for(index: int, kind: Pool) -> dict[str, str]:
    """Our gateway reads the class from its header (peers get it in the body only)."""
    return {"x-edgeroute-task": task_of(index, kind)} if kind.tasks else {}


async def one(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    speedup: float,
    servable: bool,
    headers: dict[str, str] | None = None,
) -> Result:
    t0 = time.perf_counter()
    first: float | None = None
    last = t0
    tokens = 0
    try:
        async with client.stream(
            "POST", url + "/v1/chat/completions", json=body, headers=headers
        ) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode("utf-8", "replace")
                kind = "failed"
                if r.status_code == 400 and ("context length" in text or "KV cache" in text):
                    kind = "refused" if servable else "unservable"
                elif r.status_code in (429, 503):
                    kind = "shed"
                return Result(kind, detail=f"{r.status_code}: {text[:160]}")
            score = float(r.headers.get("x-emulated-score", "nan"))
            async for chunk in r.aiter_bytes():
                now = time.perf_counter()
                if first is None and b'"content"' in chunk:
                    first = now
                last = now
                if b'"usage"' in chunk:
                    tokens = _completion_tokens(chunk) or tokens
    except httpx.HTTPError as exc:
        return Result("failed", detail=repr(exc)[:160])
    if first is None:
        return Result("failed", detail="no token in the stream")
    ttft = (first - t0) * speedup
    itl = (last - first) * speedup / (tokens - 1) if tokens > 1 else 0.0
    return Result("ok", ttft, itl, (last - t0) * speedup, tokens, score=score)


def _completion_tokens(chunk: bytes) -> int:
    at = chunk.rfind(b'"completion_tokens":')
    if at < 0:
        return 0
    digits = bytearray()
    for c in chunk[at + 20 :]:
        if 48 <= c <= 57:
            digits.append(c)
        elif digits:
            break
    return int(digits) if digits else 0


async def replay(
    url: str,
    requests: list[tuple[float, TraceRequest]],
    speedup: float,
    kind: Pool,
    operator: Coroutine[Any, Any, None] | None = None,
) -> list[Result]:
    """Send each request at its (emulated) time; the same prompts for every router.
    `operator`, if given, runs beside the replay (the operator's telemetry loop)."""
    side = asyncio.create_task(operator) if operator is not None else None
    try:
        return await _replay(url, requests, speedup, kind)
    finally:
        if side is not None:
            side.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await side


async def _replay(
    url: str, requests: list[tuple[float, TraceRequest]], speedup: float, kind: Pool
) -> list[Result]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(600.0, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        start = time.perf_counter()

        async def at(t: float, req: TraceRequest, index: int) -> Result:
            await until(start + t / speedup)
            body = body_for(req, index, kind)
            servable = fits(req, kind.profiles)
            return await one(client, url, body, speedup, servable, headers_for(index, kind))

        return await asyncio.gather(*(at(t, r, i) for i, (t, r) in enumerate(requests)))


async def closed_loop(
    url: str, trace: list[TraceRequest], clients: int, seconds: float, speedup: float, kind: Pool
) -> float:
    """Completions per emulated second with `clients` always waiting on one, counted
    after the first third of the run (the pool filling up is not its capacity)."""
    limits = httpx.Limits(max_connections=None)
    timeout = httpx.Timeout(600.0, connect=10.0)
    start = time.perf_counter()
    counted_from = start + seconds / speedup / 3
    deadline = start + seconds / speedup
    done: list[float] = []
    # Round the trace again if it runs out first (a prompt set of a hundred prompts).
    queue = iter(enumerate(itertools.cycle(trace)))
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:

        async def loop() -> None:
            for i, req in queue:
                if time.perf_counter() >= deadline:
                    return
                body = body_for(req, i, kind)
                result = await one(client, url, body, speedup, True, headers_for(i, kind))
                if result.status == "ok":
                    done.append(time.perf_counter())

        await asyncio.gather(*(loop() for _ in range(clients)))
    end = max(time.perf_counter(), counted_from + 1e-9)
    counted = sum(1 for t in done if counted_from <= t <= end)
    return counted / ((end - counted_from) * speedup)


def workers_state(urls: list[str]) -> dict[str, Any]:
    names = {
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:request_success_total",
        "emulator:lag_max_seconds",
    }
    out: dict[str, Any] = {"queries": 0.0, "hits": 0.0, "finished": [], "lag": 0.0}
    for url in urls:
        s = read_samples(httpx.get(url + "/metrics", timeout=10).text, names)
        out["queries"] += s.get("vllm:prefix_cache_queries_total", 0.0)
        out["hits"] += s.get("vllm:prefix_cache_hits_total", 0.0)
        out["finished"].append(s.get("vllm:request_success_total", 0.0))
        out["lag"] = max(out["lag"], s.get("emulator:lag_max_seconds", 0.0))
    return out


def window(trace: list[TraceRequest], count: int) -> list[TraceRequest]:
    """`count` consecutive requests, placed relative to the trace's own length: from a
    tenth of the way in (past any start-up burst) when there are enough, else from the
    start; all of a shorter trace."""
    start = len(trace) // 10
    if len(trace) - start < count:
        start = max(0, len(trace) - count)
    return trace[start : start + count]


def arrivals(
    requests: list[TraceRequest], rate: float, seconds: float, seed: int
) -> list[tuple[float, TraceRequest]]:
    """`requests` at their own spacing, scaled to a mean `rate` per second, for
    `seconds`; each moved by up to a tenth of the mean gap, by the seed."""
    if not requests:
        return []
    t0 = requests[0].t
    span = requests[-1].t - t0
    native = (len(requests) - 1) / span if span > 0 else rate
    scale = native / rate
    gap = 1.0 / rate
    rng = random.Random(seed)
    out = []
    for r in requests:
        t = (r.t - t0) * scale + rng.uniform(0.0, 0.1 * gap)
        if t > seconds:
            break
        out.append((t, r))
    out.sort(key=lambda x: x[0])
    return out


@dataclass
class Run:
    router: str
    load: float
    seed: int
    results: list[Result]
    cpu_us: float
    workers: dict[str, Any] = field(default_factory=dict)


def measure_capacity(s: Settings, trace: list[TraceRequest]) -> float:
    kind = s.workers
    servable = [r for r in trace if fits(r, kind.profiles)]
    with (
        workers(kind, s.speedup, s.data_dir, s.seeds[0]) as urls,
        running(ROUTERS[kind.capacity_router], kind, urls) as (url, _),
    ):
        # Enough clients to keep every worker's KV memory full.
        mean = (
            statistics.fmean(r.input_len + max(r.output_len, 256) for r in servable)
            if servable
            else 1
        )
        clients = max(
            len(urls),
            sum(
                PROFILES[p].kv_blocks * PROFILES[p].block_size // max(1, int(mean))
                for p in kind.profiles
            ),
        )
        return asyncio.run(closed_loop(url, servable, clients, 2 * s.seconds, s.speedup, kind))


def run_one(
    s: Settings, router: Router, load: float, seed: int, capacity: float, trace: list[TraceRequest]
) -> Run:
    reqs = arrivals(trace, load * capacity, s.seconds, seed)
    kind = s.workers
    if router.kind == "edgeroute":
        router = replace(router, policy=gateway_clock(router.policy, s.tpot_slo, s.speedup))
    with (
        workers(kind, s.speedup, s.data_dir, seed) as urls,
        running(router, kind, urls) as (url, pid),
    ):
        before = workers_state(urls)
        cpu0 = cpu_seconds(pid)
        operator = None
        if kind.telemetry is not None and router.kind == "edgeroute":
            decodes = [u for u, m in zip(urls, kind.members, strict=True) if m.role == "decode"]
            operator = operate(url, ADMIN_TOKEN, decodes, s.speedup, kind.telemetry, seed)
        results = asyncio.run(replay(url, reqs, s.speedup, kind, operator))
        cpu = cpu_seconds(pid) - cpu0
        after = workers_state(urls)
    queries = after["queries"] - before["queries"]
    finished = [a - b for a, b in zip(after["finished"], before["finished"], strict=True)]
    state = {
        "hit_rate": (after["hits"] - before["hits"]) / queries if queries else 0.0,
        "imbalance": statistics.pstdev(finished) / statistics.fmean(finished)
        if sum(finished)
        else 0.0,
        "lag_s": after["lag"],
    }
    return Run(router.name, load, seed, results, cpu * 1e6 / max(1, len(results)), state)


def summarize(run: Run, s: Settings) -> dict[str, Any]:
    ok = [r for r in run.results if r.status == "ok"]
    good = [r for r in ok if r.ttft <= s.ttft_slo and r.itl <= s.tpot_slo]
    counted = [r for r in run.results if r.status != "unservable"]
    ttfts = sorted(r.ttft for r in ok)
    scored = [r for r in ok if not math.isnan(r.score)]
    qos = [
        r.score * (r.itl <= s.tpot_slo) if r.status == "ok" and not math.isnan(r.score) else 0.0
        for r in counted
    ]
    return {
        "router": run.router,
        "load": run.load,
        "seed": run.seed,
        "requests": len(run.results),
        "served": len(ok),
        "refused": sum(r.status == "refused" for r in run.results),
        "unservable": sum(r.status == "unservable" for r in run.results),
        "shed": sum(r.status == "shed" for r in run.results),
        "failed": sum(r.status == "failed" for r in run.results),
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else math.nan,
        "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else math.nan,
        "itl_mean_ms": statistics.fmean(r.itl for r in ok) * 1e3 if ok else math.nan,
        # Per second of offered traffic (the arrival window), the same for every router.
        "goodput_rps": len(good) / s.seconds,
        "slo_attainment": len(good) / len(counted) if counted else math.nan,
        "quality": statistics.fmean(r.score for r in scored) if scored else math.nan,
        "qos": statistics.fmean(qos) if scored and qos else math.nan,
        "hit_rate": run.workers.get("hit_rate", 0.0),
        "imbalance_cv": run.workers.get("imbalance", 0.0),
        "router_cpu_us": run.cpu_us,
        "worker_lag_s": run.workers.get("lag_s", 0.0),
        "ttfts": ttfts,
    }


METRICS = (
    "ttft_mean_s",
    "ttft_p99_s",
    "itl_mean_ms",
    "goodput_rps",
    "slo_attainment",
    "quality",
    "qos",
    "hit_rate",
    "imbalance_cv",
    "router_cpu_us",
)


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    keys = sorted({(r["load"], r["router"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for load, router in keys:
        mine = [r for r in rows if r["load"] == load and r["router"] == router]
        row: dict[str, Any] = {"load": load, "router": router, "seeds": len(mine)}
        for m in METRICS:
            mean, half = interval([r[m] for r in mine])
            row[m] = f"{mean:.3g} ± {half:.2g}" if not math.isnan(mean) else "n/a"
            row[m + "_mean"] = mean
        for k in ("requests", "served", "refused", "unservable", "shed", "failed"):
            row[k] = sum(r[k] for r in mine)
        row["worker_lag_s"] = max(r["worker_lag_s"] for r in mine)
        out.append(row)
    return out


def paired(rows: list[dict[str, Any]], ours: str, peer: str, metric: str) -> tuple[float, float]:
    """Mean and 95% half-width of (ours - peer) on `metric`, paired by load and seed."""
    by = {(r["router"], r["load"], r["seed"]): r[metric] for r in rows}
    diffs = [
        by[(ours, load, seed)] - by[(peer, load, seed)]
        for (router, load, seed) in by
        if router == ours and (peer, load, seed) in by
    ]
    return interval(diffs)


def plot_cdfs(rows: list[dict[str, Any]], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    loads = sorted({r["load"] for r in rows})
    fig, axes = plt.subplots(1, len(loads), figsize=(5.5 * len(loads), 4), squeeze=False)
    for ax, load in zip(axes[0], loads, strict=True):
        for router in sorted({r["router"] for r in rows}):
            ttfts = sorted(
                t for r in rows if r["load"] == load and r["router"] == router for t in r["ttfts"]
            )
            if ttfts:
                ax.plot(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], label=router)
        ax.set(title=f"load {load:.0%} of capacity", xlabel="TTFT (s, emulated)", ylabel="CDF")
        ax.set_xscale("log")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, out, dpi=100)
    plt.close(fig)


def main(s: Settings, json_path: str | None, quick: bool, name: str) -> None:
    unknown = [r for r in s.routers if r not in ROUTERS]
    if unknown:
        raise ValueError(f"unknown routers {unknown}; known: {sorted(ROUTERS)}")
    if s.pool not in POOLS:
        raise ValueError(f"unknown pool {s.pool!r}; known: {sorted(POOLS)}")
    elsewhere = [r for r in s.routers if s.pool not in ROUTERS[r].pools]
    if elsewhere:
        fit = sorted(n for n, r in ROUTERS.items() if s.pool in r.pools)
        raise ValueError(f"routers {elsewhere} do not route the {s.pool} pool; these do: {fit}")
    trace_all = read_trace(s.trace)
    if not trace_all:
        raise ValueError(f"{s.trace}: the trace has no requests")
    # Enough requests for the longest run at the highest load, measured or guessed high.
    probe = window(trace_all, 2000)
    servable = sum(fits(r, s.workers.profiles) for r in probe)
    span = trace_all[-1].t - trace_all[0].t
    print(
        f"trace {s.trace.name}: {len(trace_all)} requests over {span:.0f} s; of a window of "
        f"{len(probe)}, {len(probe) - servable} fit no worker of the pool",
        flush=True,
    )
    if s.capacity is not None:
        capacity = s.capacity
    else:
        capacity = measure_capacity(s, probe) if servable else 0.0
    if servable == 0:
        print("no request of the window fits any worker of the pool: nothing to route")
    how = "given" if s.capacity is not None else "measured"
    print(f"pool capacity ({how}): {capacity:.3f} completions per second (emulated)", flush=True)
    trace = window(trace_all, math.ceil(max(s.loads) * capacity * s.seconds * 1.5) + 20)
    rows = []
    progress = output_dir(quick) / f"{name}.progress.jsonl"
    progress.unlink(missing_ok=True)
    print(f"each run's row is appended to {progress} as it ends", flush=True)
    total = len(s.routers) * len(s.loads) * len(s.seeds)
    done = 0
    for seed in s.seeds:
        for load in s.loads:
            for router in s.routers:
                done += 1
                if capacity <= 0:
                    continue
                try:
                    run = run_one(s, ROUTERS[router], load, seed, capacity, trace)
                except (RuntimeError, FileNotFoundError) as exc:
                    print(f"[{done}/{total}] {router}: could not run: {exc}", flush=True)
                    continue
                row = summarize(run, s)
                rows.append(row)
                with progress.open("a") as f:  # kept if the run is cut short
                    f.write(json.dumps({k: v for k, v in row.items() if k != "ttfts"}) + "\n")
                print(
                    f"[{done}/{total}] seed {seed} load {load:.0%} {router:<28} "
                    f"TTFT {row['ttft_mean_s']:.2f} s  goodput {row['goodput_rps']:.3f}/s  "
                    f"served {row['served']}/{row['requests']}  lag {row['worker_lag_s']:.3f} s",
                    flush=True,
                )
    table = aggregate(rows)
    ours = [r for r in s.routers if ROUTERS[r].kind == "edgeroute"]
    peers = [r for r in s.routers if ROUTERS[r].kind != "edgeroute"]
    comparisons = []
    for load in s.loads:
        at = [r for r in table if r["load"] == load]
        compared = [("ttft_mean_s", min), ("goodput_rps", max)]
        if s.workers.quality:
            compared.append(("qos", max))
        for metric, better in compared:
            candidates = [
                r for r in at if r["router"] in peers and not math.isnan(r[metric + "_mean"])
            ]
            mine = [r for r in at if r["router"] in ours and not math.isnan(r[metric + "_mean"])]
            if not candidates or not mine:
                continue
            best_peer = better(candidates, key=lambda r: r[metric + "_mean"])["router"]
            best_ours = better(mine, key=lambda r: r[metric + "_mean"])["router"]
            diff, half = paired(
                [x for x in rows if x["load"] == load], best_ours, best_peer, metric
            )
            comparisons.append(
                {
                    "load": load,
                    "metric": metric,
                    "best_ours": best_ours,
                    "best_peer": best_peer,
                    "ours_minus_peer": f"{diff:.3g} ± {half:.2g}",
                }
            )
    notes = (
        f"Trace `{s.trace.name}`; pool `{s.pool}`: {s.workers.notes}; "
        f"speedup {s.speedup:g}; {s.seconds:g} emulated s of arrivals per run; seeds "
        f"{list(s.seeds)}; capacity {capacity:.3f}/s "
        + (
            "(given with --capacity)"
            if s.capacity is not None
            else f"measured by a closed loop through {s.workers.capacity_router}"
        )
        + f". SLOs: TTFT <= {s.ttft_slo:g} s and mean inter-token latency <= "
        f"{s.tpot_slo * 1000:g} ms (emulated). Values: mean ± 95% half-width over seeds. "
        "`refused`: sent to a worker that cannot hold it; `unservable`: no worker can; "
        "`shed`: answered 429/503 by the router. "
        "`worker_lag_s`: the workers' worst lag behind their clocks (the time-scaling "
        "error). The llm-d row is a re-creation of its default scoring with our scorers.\n\n"
        "## Best of ours against the best peer (paired by seed)\n\n"
        + (
            "| load | metric | best of ours | best peer | ours - peer |\n|---|---|---|---|---|\n"
            + "\n".join(
                f"| {c['load']:g} | {c['metric']} | {c['best_ours']} | {c['best_peer']} | "
                f"{c['ours_minus_peer']} |"
                for c in comparisons
            )
            if comparisons
            else "(no peer ran)"
        )
    )
    shown = [m for m in METRICS if s.workers.quality or m not in ("quality", "qos")]
    columns = [
        "load",
        "router",
        "seeds",
        *shown,
        "requests",
        "served",
        "refused",
        "unservable",
        "shed",
        "failed",
        "worker_lag_s",
    ]
    write(
        name,
        {
            "command": "edgeroute bench live" + (" --quick" if quick else ""),
            "trace": s.trace.name,
            "pool": s.pool,
            "routers": list(s.routers),
            "loads": list(s.loads),
            "seeds": list(s.seeds),
            "seconds": s.seconds,
            "speedup": s.speedup,
            "capacity_rps": capacity,
            "ttft_slo_s": s.ttft_slo,
            "tpot_slo_s": s.tpot_slo,
            "comparisons": comparisons,
        },
        [{k: v for k, v in r.items() if k != "ttfts"} for r in rows],
        columns,
        json_path,
        notes=notes,
        quick=quick,
        table_rows=table,
    )
    if rows:
        draw(
            Plot(
                "load",
                ("ttft_mean_s_mean", "goodput_rps_mean"),
                ("router",),
                "Routers on live traffic: mean TTFT and goodput against load (means over seeds)",
            ),
            table,
            output_dir(quick) / f"{name}.png",
        )
        plot_cdfs(rows, output_dir(quick) / f"{name}_ttft_cdf.png")
