"""The worker pools `bench live` routes over, and what each needs to be set up.

- `mixed`: four engines of different speeds and KV memory, whole requests.
- `experts`: RouterBench's six open models, each answering with its own real score and
  length for the prompts in the quality data (for quality-aware routing: `qos_drl`).
- `moe`: four Mixtral workers in MoE mode, each hosting half of every layer's experts
  (every expert on two workers, in a layout that rotates with the layer); the rest are
  remote calls. Requests carry a task class whose measured per-layer activation
  frequencies drive the experts used (for `prism`).
- `pd`: prefill/decode disaggregation, two prefill and four decode instances in a
  three-pod topology where no decode instance shares a prefill instance's rack; KV
  caches cross the emulated network into the decode instance (for NetKV and
  vllm-router's PD mode). The workers' network is the topology the oracle is given.
- `pd-net`: the same instances on a network of their own: the workers' tier
  capacities are not the oracle's nominal figures, each decode instance has its own
  background on each tier into it, wandering around a mean drawn per instance and
  seed (hot spots), and congestion reaches the gateway only from the operator's
  telemetry loop (`bench.operator`), late and inexactly.

A pool yields the worker commands, the gateway's backend entries and extra settings,
and a peer router's worker arguments.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from edgeroute.bench.operator import Telemetry
from workers.profiles import EXPERTS, PROFILES

MODEL = "live"
WORKER_TOKEN = "live-bench-worker"  # the MoE workers' admin token, for Prism's pushes
ADMIN_TOKEN = "live-bench-operator"  # the gateway's, for the operator's telemetry


@dataclass(frozen=True)
class Member:
    """One emulated worker of a pool."""

    profile: str
    role: str = "both"  # "both", "prefill" or "decode"
    name: str = ""  # its instance id (and backend id); empty: w<index>
    hosted: tuple[tuple[int, int], ...] = ()  # MoE mode: the (layer, expert) it hosts


def _rotating_halves(
    workers: int, layers: int = 32, experts: int = 8
) -> list[list[tuple[int, int]]]:
    """Each worker hosts half of every layer's experts; each expert lives on two workers,
    and which ones rotates with the layer, so no worker is local for a whole class."""
    half = experts // 2
    out: list[list[tuple[int, int]]] = [[] for _ in range(workers)]
    for layer in range(layers):
        for w in range(workers):
            start = (layer * 3 + w * (experts // workers)) % experts
            out[w].extend((layer, (start + k) % experts) for k in range(half))
    return out


# Two prefill racks without decode instances; decode racks in the same two pods and in a
# third pod, so a transfer crosses the pod or the cluster tier, never stays in a rack.
PD_TOPOLOGY: dict[str, Any] = {
    "instances": {
        "p0": {"node": "n0", "rack": "r0", "pod": "a"},
        "p1": {"node": "n1", "rack": "r2", "pod": "b"},
        "d0": {"node": "n2", "rack": "r1", "pod": "a"},
        "d1": {"node": "n3", "rack": "r1", "pod": "a"},
        "d2": {"node": "n4", "rack": "r3", "pod": "b"},
        "d3": {"node": "n5", "rack": "r4", "pod": "c"},
    },
    # Gbps and microseconds, the oracle's units; congestion as a share of the tier.
    "tier_bandwidth": {"node": 3200.0, "rack": 100.0, "pod": 50.0, "cluster": 12.5},
    "tier_latency": {"node": 1.0, "rack": 5.0, "pod": 10.0, "cluster": 20.0},
    "congestion": {"pod": 0.5},
}
# What the links of `pd-net` really carry per flow into an instance (the oracle is told
# PD_TOPOLOGY's nominal figures, without congestion).
PHYSICAL: dict[str, Any] = {
    **PD_TOPOLOGY,
    "tier_bandwidth": {"node": 3200.0, "rack": 80.0, "pod": 30.0, "cluster": 20.0},
    "congestion": {},
}
NOMINAL: dict[str, Any] = {**PD_TOPOLOGY, "congestion": {}}


@dataclass(frozen=True)
class Pool:
    name: str
    members: tuple[Member, ...]
    capacity_router: str  # the router the pool's capacity is measured through
    tasks: tuple[str, ...] = ()  # request classes, drawn per request (MoE)
    topology: dict[str, Any] | None = None  # disaggregated pools: the oracle's
    network: dict[str, Any] | None = None  # the workers' own, when not the oracle's
    background: dict[str, float] = field(default_factory=dict)  # per-tier mean, decode side
    telemetry: Telemetry | None = None  # congestion from the operator's loop
    quality: bool = False  # the workers answer with the data's real scores
    notes: str = ""
    extra_settings: dict[str, Any] = field(default_factory=dict)

    @property
    def profiles(self) -> list[str]:
        return [m.profile for m in self.members]

    @property
    def disaggregated(self) -> bool:
        return self.topology is not None

    def ids(self) -> list[str]:
        return [m.name or f"w{i}" for i, m in enumerate(self.members)]

    def worker_command(
        self, i: int, port: int, speedup: float, folder: Path, data_dir: Path | None, seed: int
    ) -> list[str]:
        m = self.members[i]
        names = [MODEL, m.profile] if self.quality else [MODEL]
        cmd = [
            sys.executable,
            "-m",
            "edgeroute.cli",
            "worker",
            "--profile",
            m.profile,
            "--port",
            str(port),
            "--speedup",
            str(speedup),
            "--log-level",
            "WARNING",
            "--plain-logs",
        ]
        for name in names:
            cmd += ["--served-model-name", name]
        if data_dir is not None:
            cmd += ["--data-dir", str(data_dir)]
        if self.topology is not None:
            path = folder / "topology.yaml"
            path.write_text(yaml.safe_dump(self.network or self.topology))
            cmd += ["--role", m.role, "--instance-id", self.ids()[i], "--topology", str(path)]
            if m.role == "decode" and self.background:
                for tier, level in self.hot_spots(i, seed).items():
                    cmd += ["--background", f"{tier}={level:.4f}"]
                cmd += ["--seed", str(seed * 100 + i)]
        if m.hosted:
            path = folder / f"moe-{i}.yaml"
            path.write_text(yaml.safe_dump({"hosted": [list(h) for h in m.hosted]}))
            cmd += ["--moe", str(path), "--admin-token", WORKER_TOKEN]
        return cmd

    def backends(self, urls: Sequence[str]) -> list[dict[str, Any]]:
        out = []
        for m, url, bid in zip(self.members, urls, self.ids(), strict=True):
            entry: dict[str, Any] = {"url": url, "id": bid}
            if self.topology is not None:
                entry["role"] = m.role
                entry["profile"] = engine_profile(m.profile)
            if m.hosted:
                entry["moe"] = {
                    "gpu_memory_gb": [len(m.hosted) * 0.35],
                    "expert_gb": 0.35,
                    "io_gbps": [2.0],
                    "admin_token": WORKER_TOKEN,
                }
            out.append(entry)
        return out

    def hot_spots(self, i: int, seed: int) -> dict[str, float]:
        """Worker `i`'s own mean background per tier: log-normal around the pool's."""
        rng = random.Random(seed * 100 + i)
        spread = 0.6
        return {
            tier: min(0.9, mean * math.exp(rng.gauss(-spread * spread / 2, spread)))
            for tier, mean in self.background.items()
        }

    def gateway_settings(self) -> dict[str, Any]:
        extra = dict(self.extra_settings)
        if self.topology is not None:
            extra["oracle"] = self.topology
        if self.telemetry is not None:
            extra["admin_token"] = ADMIN_TOKEN
        return extra

    def peer_workers(self, urls: Sequence[str], kind: str) -> list[str]:
        """A peer router's arguments naming the workers."""
        if self.topology is None:
            return ["--worker-urls", *urls]
        if kind != "vllm-router":
            raise ValueError(f"{kind} has no prefill/decode mode here")
        args = ["--vllm-pd-disaggregation"]
        for m, url in zip(self.members, urls, strict=True):
            args += ["--prefill" if m.role == "prefill" else "--decode", url]
        return args


# NetKV's decode cost needs a profile of the engine, as an operator would measure it:
# the emulated engine's iteration costs, per sequence at an 8K-token context (the
# gateway's profile has no per-token term).
PROFILE_CONTEXT = 8192


def engine_profile(name: str) -> dict[str, float]:
    p = PROFILES[name]
    return {
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "iter_base": p.base,
        "iter_per_seq": p.k2 * PROFILE_CONTEXT,
        "max_batch": p.max_batch,
    }


_HALVES = _rotating_halves(4)
# The prefill/decode pools' instances, named as in PD_TOPOLOGY.
PD_MEMBERS = tuple(
    Member("mistral-7b-chat", "prefill" if name.startswith("p") else "decode", name)
    for name in ("p0", "p1", "d0", "d1", "d2", "d3")
)

POOLS = {
    p.name: p
    for p in (
        Pool(
            "mixed",
            tuple(
                Member(p)
                for p in (
                    "mistral-7b-chat",
                    "WizardLM-13B-V1.2",
                    "mixtral-8x7b-chat",
                    "llama-2-70b-chat",
                )
            ),
            capacity_router="least_load",
            notes="four engines of different speeds and KV memory, one worker each",
        ),
        Pool(
            "experts",
            tuple(Member(p) for p in EXPERTS),
            capacity_router="least_load",
            quality=True,
            notes=(
                "RouterBench's six open models, one worker each, answering every prompt of "
                "the quality data with that model's real score and length"
            ),
        ),
        Pool(
            "moe",
            tuple(Member("mixtral-8x7b-chat", hosted=tuple(h)) for h in _HALVES),
            capacity_router="least_load",
            tasks=("gsm8k", "humaneval"),
            notes=(
                "four Mixtral workers in MoE mode, each hosting half of every layer's "
                "experts (each expert on two workers, rotating with the layer); task "
                "classes gsm8k and humaneval drawn per request, their tokens' experts "
                "drawn independently from the measured per-layer frequencies "
                "(synthetic per-token selections)"
            ),
            extra_settings={"prism_replan_seconds": 5.0},  # wall seconds: often, time-scaled
        ),
        Pool(
            "pd",
            PD_MEMBERS,
            capacity_router="decode_la",
            topology=PD_TOPOLOGY,
            notes=(
                "two prefill and four decode mistral-7b workers; no decode instance in a "
                "prefill rack; the pod tier 50% congested. The workers' emulated network "
                "is the topology the oracle is given (the same file): NetKV's model is "
                "the physics here, as #20 says"
            ),
        ),
        Pool(
            "pd-net",
            PD_MEMBERS,
            capacity_router="decode_la",
            topology=NOMINAL,
            network=PHYSICAL,
            background={"pod": 0.3, "cluster": 0.3},
            telemetry=Telemetry(),
            notes=(
                "two prefill and four decode mistral-7b workers, placed as in `pd`, on a "
                "network of their own: per-flow tier capacities rack 80, pod 30, cluster "
                "20 Gbps into an instance (the oracle is told 100, 50, 12.5), each decode "
                "instance's own background on the pod and cluster tiers wandering around "
                "a mean drawn per instance and seed (log-normal around 30%); congestion "
                "reaches the gateway only from the operator's loop (per-tier utilisation "
                "every 1 s, 2 s late, 10% noise)"
            ),
        ),
    )
}
