"""What the gateway adds in front of a fast backend: `edgeroute bench overhead`.

Two `edgeroute.bench.fast_backend` processes, which answer at once, serve as the backend.
The load generator and the backends share CPU 0; the gateway gets CPU 1 (the
method of the peers harness in shared/bench-peers). Each round measures the
direct path and the gateway under each policy, interleaved; the table gives
medians over rounds. Non-streaming requests of 16 tokens; TTFT with 8 streams.

A second phase measures the decision on the request path where it costs most: 12
backends, each serving another of the QoS predictor's models and holding every answer
(`--hold-ms`), kept full by more clients than their queues hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import yaml

from edgeroute.bench.loadgen import closed_loop, cpu_seconds, percentile, post
from edgeroute.results_io import Plot, table, write

MODEL = "instant"
MODELS = "instant,llama-2-70b-chat"
LOAD_CPU, GATEWAY_CPU = 0, 1
# The full-queue phase: 12 backends (the QoS paper's largest N) answering 200 ms late,
# 15 clients each, so that each holds more than its 5 running + 5 waiting.
FULL_BACKENDS, FULL_HOLD_MS, FULL_CLIENTS = 12, 200.0, 180
FULL_TARGETS = ("least_load", "qos_drl", "qos_drl@warm")
KEEP_WARM_MS = 1.0  # the idle gap after which the decision was measured slower
IDLE_SECONDS = 2.0  # after each target's phases: its CPU use while idle
DECISION_BUDGET = 0.0003  # seconds: the QoS policy's p99 budget at N=12 with full queues


def pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > cpu:
        os.sched_setaffinity(0, {cpu})


class ServerExited(RuntimeError):
    """A server process ended before it answered."""


def last_words(said: IO[bytes], lines: int = 5) -> str:
    """The last `lines` a process wrote to `said` (its stderr, a file), on one line."""
    said.seek(0)
    tail = said.read().decode(errors="replace").strip().splitlines()[-lines:]
    return " | ".join(tail) if tail else "it wrote nothing"


def wait_ready(
    url: str,
    timeout: float = 30.0,
    proc: subprocess.Popen[bytes] | None = None,
    said: IO[bytes] | None = None,
) -> None:
    """Until `url` answers 200; `proc`, when given, is the server, and its exit ends
    the wait at once (`ServerExited`), quoting the end of `said` (the file its stderr
    goes to), when given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            why = "" if said is None else f": {last_words(said)}"
            raise ServerExited(f"{proc.args!r} exited with {proc.returncode}{why}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def spawn(
    args: list[str], cpu: int, stderr: IO[bytes] | int = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "edgeroute.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        preexec_fn=lambda: pin(cpu),
    )


def fast_backend(port: int, models: str, *args: str) -> subprocess.Popen[bytes]:
    """A `fast_backend` on `port` serving `models` (comma-separated), on the load
    side's CPU."""
    command = [sys.executable, "-m", "edgeroute.bench.fast_backend", "--port", str(port)]
    return subprocess.Popen(
        [*command, "--model", models, *args],
        preexec_fn=lambda: pin(LOAD_CPU),
    )


def start_gateway(
    port: int, backends: Sequence[str | dict[str, Any]], target: str, **settings: Any
) -> subprocess.Popen[bytes]:
    """`target` is a policy name, optionally with `@asyncio` or `@h11` for the event
    loop or HTTP parser to measure instead of uvloop and httptools, or `@warm` for
    `keep_warm_ms` at `KEEP_WARM_MS`; `backends` are URLs
    or the gateway's backend entries; `settings` override the gateway's."""
    policy, _, variant = target.partition("@")
    cfg: dict[str, Any] = {
        "port": port,
        "backends": [b if isinstance(b, dict) else {"url": b} for b in backends],
        "routing": {"default": {"policy": policy}},
        "log_level": "WARNING",
        "max_inflight": 0,
        **settings,
    }
    if policy.startswith("netkv"):
        # NetKV's preset picks decode instances; here it scores the plain route (its
        # queueing and step terms: there is no prefill hop to price).
        cfg["routing"]["default"]["filters"] = ["healthy", "serves_model", "role"]
    if variant == "asyncio":
        cfg["event_loop"] = "asyncio"
    elif variant == "h11":
        cfg["http_parser"] = "h11"
    elif variant == "warm":
        cfg["keep_warm_ms"] = KEEP_WARM_MS
    elif variant:
        raise ValueError(f"unknown variant {variant!r} (asyncio, h11 or warm)")
    fd, name = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(cfg))
    # What it writes (warnings and errors) is read only if it exits before it is ready.
    with tempfile.TemporaryFile() as said:
        try:
            proc = spawn(["serve", "--config", name], GATEWAY_CPU, stderr=said)
            wait_ready(f"http://127.0.0.1:{port}/readyz", proc=proc, said=said)
        finally:
            os.unlink(name)  # read at start-up; later changes come through the store
    return proc


@contextlib.contextmanager
def emulated_pool(
    count: int,
    port: int,
    worker_args: list[str],
    policy: str,
    **settings: Any,
) -> Iterator[subprocess.Popen[bytes]]:
    """`count` emulated workers (one process, on the load side's CPU, from `port` + 1)
    behind a gateway on `port` (on its own CPU); yields the gateway's process."""
    first = port + 1
    args = ["worker", "--count", str(count), "--port", str(first), "--log-level", "WARNING"]
    workers = spawn(args + worker_args, LOAD_CPU)
    backends = [f"http://127.0.0.1:{first + i}" for i in range(count)]
    try:
        for b in backends:
            wait_ready(b + "/health")
        gw = start_gateway(port, backends, policy, **settings)
        try:
            yield gw
        finally:
            gw.terminate()
            gw.wait(10)
    finally:
        workers.terminate()
        workers.wait(10)


@dataclass(frozen=True)
class DecisionHistogram:
    """The gateway's decision-time histogram at one instant, summed over policies."""

    total: float
    count: float
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count)

    @classmethod
    def read(cls, port: int) -> DecisionHistogram:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        total = count = 0.0
        cumulative: dict[float, float] = {}
        for line in text.splitlines():
            if line.startswith("edgeroute_policy_decision_seconds_sum"):
                total += float(line.split()[-1])
            elif line.startswith("edgeroute_policy_decision_seconds_count"):
                count += float(line.split()[-1])
            elif line.startswith("edgeroute_policy_decision_seconds_bucket"):
                le = float(line.split('le="')[1].split('"')[0])
                cumulative[le] = cumulative.get(le, 0.0) + float(line.split()[-1])
        return cls(total, count, tuple(sorted(cumulative.items())))

    def since(self, earlier: DecisionHistogram) -> DecisionHistogram:
        """The decisions made between `earlier` and this reading (before the first
        decision the histogram has no series at all)."""
        before = dict(earlier.buckets)
        return DecisionHistogram(
            self.total - earlier.total,
            self.count - earlier.count,
            tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets),
        )

    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def share_over(self, seconds: float) -> float:
        """The share of decisions that took longer than `seconds`: exact when
        `seconds` is one of the histogram's bounds (else the next bound up counts)."""
        if not self.count:
            return 0.0
        within = next((n for le, n in self.buckets if le >= seconds), self.count)
        return (self.count - within) / self.count

    def quantile(self, q: float) -> float:
        """Interpolated within the bucket, as Prometheus' histogram_quantile does."""
        if not self.count:
            return 0.0
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, n in self.buckets:
            if n >= rank:
                if le == float("inf"):
                    return lower
                return lower + (le - lower) * (rank - below) / max(n - below, 1e-12)
            lower, below = le, n
        return lower


async def measure(port: int, seconds: float, pid: int | None) -> dict[str, float]:
    body = b'{"model":"instant","messages":[{"role":"user","content":"hello"}],"max_tokens":16}'
    raw = post("/v1/chat/completions", body)
    gateway = pid is not None
    before = DecisionHistogram.read(port) if gateway else None
    c1 = await closed_loop("127.0.0.1", port, raw, 1, seconds)
    # The decisions of the c=1 phase alone, to set against that phase's latency.
    c1_decisions = DecisionHistogram.read(port).since(before) if before else None
    cpu0 = cpu_seconds(pid) if pid else 0.0
    c32 = await closed_loop("127.0.0.1", port, raw, 32, seconds)
    cpu_per_req = ((cpu_seconds(pid) - cpu0) / max(1, len(c32.latencies)) * 1e6) if pid else 0.0
    stream_body = body[:-1] + b',"stream":true}'
    s8 = await closed_loop("127.0.0.1", port, post("/v1/chat/completions", stream_body), 8, seconds)
    # What the gateway spends doing nothing: its own loops, and warm-ups if kept warm.
    idle_pct = 0.0
    if pid:
        cpu1 = cpu_seconds(pid)
        await asyncio.sleep(IDLE_SECONDS)
        idle_pct = 100 * (cpu_seconds(pid) - cpu1) / IDLE_SECONDS
    out = {
        "c1_p50_ms": percentile(c1.latencies, 50) * 1e3,
        "c1_p99_ms": percentile(c1.latencies, 99) * 1e3,
        "c32_rps": c32.rps,
        "c32_p50_ms": percentile(c32.latencies, 50) * 1e3,
        "c32_p99_ms": percentile(c32.latencies, 99) * 1e3,
        "ttft8_p50_ms": percentile(s8.first_bytes, 50) * 1e3,
        "cpu_us_per_req": cpu_per_req,
        "idle_cpu_pct": idle_pct,
        "errors": float(c1.errors + c32.errors + s8.errors),
    }
    if c1_decisions is not None:
        out["decision_us"] = c1_decisions.mean() * 1e6
        out["decision_p50_us"] = c1_decisions.quantile(0.5) * 1e6
        out["decision_p99_us"] = c1_decisions.quantile(0.99) * 1e6
        out["decision_all_us"] = DecisionHistogram.read(port).mean() * 1e6
    return out


def inflight_per_backend(port: int) -> float:
    """The gateway's in-flight requests per backend, averaged over backends."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    counts = [
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("edgeroute_inflight_requests{")
    ]
    return statistics.fmean(counts) if counts else 0.0


async def measure_full(port: int, seconds: float) -> dict[str, float]:
    """Decisions while every backend's queue is full: the gateway's own histogram over
    the phase, the in-flight requests per backend sampled through it, and the share
    of requests the policy shed."""
    from edgeroute.bench.policies import MEDIAN_PROMPT

    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": MEDIAN_PROMPT}],
            "max_tokens": 16,
        }
    ).encode()
    before = DecisionHistogram.read(port)
    depth: list[float] = []

    async def sample() -> None:
        while True:
            await asyncio.sleep(0.25)
            depth.append(await asyncio.to_thread(inflight_per_backend, port))

    sampler = asyncio.create_task(sample())
    try:
        raw = post("/v1/chat/completions", body)
        run = await closed_loop("127.0.0.1", port, raw, FULL_CLIENTS, seconds)
    finally:
        sampler.cancel()
    decisions = DecisionHistogram.read(port).since(before)
    answered = sum(run.statuses.values())
    return {
        "decisions": decisions.count,
        "inflight_per_backend": statistics.fmean(depth[2:] or depth or [0.0]),
        "shed_pct": 100.0 * run.statuses.get(503, 0) / max(1, answered),
        "decision_us": decisions.mean() * 1e6,
        "decision_p50_us": decisions.quantile(0.5) * 1e6,
        "decision_p99_us": decisions.quantile(0.99) * 1e6,
        "over_budget_pct": 100.0 * decisions.share_over(DECISION_BUDGET),
    }


def full_queue_phase(rounds: int, seconds: float, targets: list[str]) -> list[dict[str, Any]]:
    """`targets` behind the gateway, one at a time per round, on `FULL_BACKENDS`
    backends that hold every answer; medians over rounds, and each round's p99 and
    share over budget."""
    from policies.predictor import DEFAULT_PREDICTOR_DIR

    models = json.loads((DEFAULT_PREDICTOR_DIR / "predictor.json").read_text())["models"]
    port = 18620
    ports = [port + 1 + i for i in range(FULL_BACKENDS)]
    workers = [
        fast_backend(p, f"{MODEL},{models[i % len(models)]}", "--hold-ms", str(FULL_HOLD_MS))
        for i, p in enumerate(ports)
    ]
    backends = [f"http://127.0.0.1:{p}" for p in ports]
    samples: dict[str, list[dict[str, float]]] = {t: [] for t in targets}
    try:
        for b in backends:
            wait_ready(b + "/health")
        for r in range(rounds):
            for target in targets if r % 2 == 0 else targets[::-1]:
                print(f"full queues, round {r + 1}/{rounds}: {target}", flush=True)
                gw = start_gateway(port, backends, target)
                try:
                    samples[target].append(asyncio.run(measure_full(port, seconds)))
                finally:
                    gw.terminate()
                    gw.wait(10)
    finally:
        for w in workers:
            w.terminate()
            w.wait(10)
    return [
        {
            "phase": "full_queues",
            "policy": t,
            "backends": FULL_BACKENDS,
            **{k: round(statistics.median(s[k] for s in runs), 3) for k in runs[0]},
            # each round's tail, beside the medians (the JSON keeps them)
            "rounds_decision_p99_us": [round(s["decision_p99_us"], 1) for s in runs],
            "rounds_over_budget_pct": [round(s["over_budget_pct"], 3) for s in runs],
        }
        for t, runs in samples.items()
    ]


def main(quick: bool, seed: int, json_path: str | None, policies: list[str]) -> None:
    pin(LOAD_CPU)
    rounds, seconds = (1, 2.0) if quick else (3, 8.0)
    worker_port, gw_port = 18601, 18600
    ports = (worker_port, worker_port + 1)
    # The second name maps the backend to an expert the QoS predictor knows.
    workers = [fast_backend(p, MODELS) for p in ports]
    backends = [f"http://127.0.0.1:{p}" for p in ports]
    samples: dict[str, list[dict[str, float]]] = {"direct": []}
    samples.update({p: [] for p in policies})
    try:
        for b in backends:
            wait_ready(b + "/health")
        for r in range(rounds):
            order = ["direct", *policies]
            if r % 2:
                order.reverse()
            for target in order:
                print(f"round {r + 1}/{rounds}: {target}", flush=True)
                if target == "direct":
                    samples[target].append(asyncio.run(measure(worker_port, seconds, None)))
                    continue
                gw = start_gateway(gw_port, backends, target)
                try:
                    samples[target].append(asyncio.run(measure(gw_port, seconds, gw.pid)))
                finally:
                    gw.terminate()
                    gw.wait(10)
    finally:
        for w in workers:
            w.terminate()
            w.wait(10)
    full_targets = [t for t in policies if t in FULL_TARGETS]
    full = full_queue_phase(rounds, seconds, full_targets) if full_targets else []
    med = {
        t: {k: statistics.median(s[k] for s in runs) for k in runs[0]}
        for t, runs in samples.items()
    }
    base = med["direct"]
    rows: list[dict[str, Any]] = []
    for target, m in med.items():
        row: dict[str, Any] = {"policy": target, **{k: round(v, 3) for k, v in m.items()}}
        if target != "direct":
            row["added_c1_p50_ms"] = round(m["c1_p50_ms"] - base["c1_p50_ms"], 3)
            row["added_c1_p99_ms"] = round(m["c1_p99_ms"] - base["c1_p99_ms"], 3)
            row["added_ttft8_p50_ms"] = round(m["ttft8_p50_ms"] - base["ttft8_p50_ms"], 3)
            # The decision's share of the request's whole time through the gateway at c=1,
            # both from the c=1 phase: the mean (which carries any garbage collection an
            # allocation in the decision happened to start) and the median.
            row["decision_pct_of_c1_p50"] = round(m["decision_us"] / (m["c1_p50_ms"] * 10), 2)
            row["decision_p50_pct"] = round(m["decision_p50_us"] / (m["c1_p50_ms"] * 10), 2)
        rows.append(row)
    write(
        "overhead",
        {
            "command": "edgeroute bench overhead" + (" --quick" if quick else ""),
            "rounds": rounds,
            "seconds": seconds,
            "seed": seed,
            "backend": "2 bench.fast_backend processes, 16 tokens",
            "full_queues": {
                "backends": FULL_BACKENDS,
                "hold_ms": FULL_HOLD_MS,
                "clients": FULL_CLIENTS,
            },
        },
        rows + full,
        [
            "policy",
            "c1_p50_ms",
            "added_c1_p50_ms",
            "added_c1_p99_ms",
            "c32_rps",
            "c32_p50_ms",
            "ttft8_p50_ms",
            "added_ttft8_p50_ms",
            "cpu_us_per_req",
            "idle_cpu_pct",
            "decision_us",
            "decision_p50_us",
            "decision_p99_us",
            "decision_pct_of_c1_p50",
            "decision_p50_pct",
            "decision_all_us",
            "errors",
        ],
        json_path,
        quick=quick,
        table_rows=rows,
        plot=Plot(
            "policy",
            ("added_c1_p50_ms", "c32_rps", "cpu_us_per_req"),
            title="What the gateway adds in front of a fast backend, per target",
        ),
        notes="Load generator and backends pinned to CPU 0, gateway to CPU 1. `direct` "
        "talks to one worker; the gateway spreads over both. req/s at c=32 is bounded "
        "by the backend and load generator sharing CPU 0, so it is a lower bound for "
        "the gateway; CPU us/req is the gateway process's own CPU time per request, "
        f"`idle_cpu_pct` its CPU use over {IDLE_SECONDS:g} s without requests after the "
        f"phases (`@warm`: `keep_warm_ms` = {KEEP_WARM_MS:g}, the last decision repeated "
        "while idle). "
        "Decision figures come from the gateway's own decision histogram over the c=1 "
        "phase; its percentiles are interpolated within the histogram's buckets."
        + (full_queue_notes(full) if full else ""),
    )


def full_queue_notes(full: list[dict[str, Any]]) -> str:
    return (
        f"\n\n## Decisions on the request path with full queues\n\n{FULL_BACKENDS} "
        f"fast backends, each serving another of the QoS predictor's models and answering "
        f"{FULL_HOLD_MS:g} ms late (reporting what they hold as 5 running, the rest "
        f"waiting), {FULL_CLIENTS} clients sending the QoS evaluation split's median prompt "
        "back to back. Figures from the gateway's decision histogram over each run; "
        "`inflight_per_backend` is the gateway's in-flight gauge sampled every 0.25 s "
        "(the policy's queues hold 5 running and 5 waiting); `shed_pct`: answers that were "
        "503; `over_budget_pct`: decisions over the QoS policy's 300 us budget (a bucket "
        "bound, so exact; p99 within budget means at most 1%).\n\n"
        + table(
            full,
            [
                "policy",
                "backends",
                "decisions",
                "inflight_per_backend",
                "shed_pct",
                "decision_us",
                "decision_p50_us",
                "decision_p99_us",
                "over_budget_pct",
            ],
        )
    )
