"""The NetKV paper's cluster: a multi-tier fat-tree of GPU instances (section VI-A).

Defaults: 2 pods x 2 racks x 2 servers x 8 GPUs, TP=4: 16 instances, 4 prefill and 12
decode. The prefill instances fill rack 0 and no decode instance shares their rack, so a
KV cache crosses the pod tier (rack 1) or the cluster tier (pods' racks 2 and 3).

The links have physical capacities of their own, and nothing else limits a flow:
- every GPU has a NIC of the ToR bandwidth, up and down;
- a rack's uplinks carry its GPUs' ToR bandwidth over max(1, r/2), split over the
  aggregation switches; a pod's core links carry its GPUs' ToR bandwidth over r;
- NVLink inside a server.
A flow gets what max-min sharing gives it on its path, so a lone flow runs at its
NIC's rate whatever its tier: the tiers differ only when the fabric is loaded. A KV
transfer is TP parallel shard flows, GPU to GPU, each with its own ECMP draw.

Background traffic is per link: each network link has its own mean utilisation, drawn
around the configured level with a log-normal spread (ECMP hot spots), which the
simulator moves over time; elephant flows are real flows in the network (`sim.cluster`).
The oracle's tier bandwidths (`topology()`) are the operator's nominal figures; the
physics never reads them.

The paper's numbers for the tiers were lost in extraction; we use its stated
ratios around a 50 Gbps ToR: pod 25 Gbps (2:1), cross-pod 12.5 Gbps (4:1),
NVLink 450 GB/s.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from edgeroute.sim.network import Network
from oracle.topology import Topology


@dataclass(frozen=True)
class FatTreeConfig:
    pods: int = 2
    racks_per_pod: int = 2
    servers_per_rack: int = 2
    gpus_per_server: int = 8
    tp: int = 4
    prefill_servers: tuple[int, ...] = (0, 1)  # rack 0: no decode instance in a prefill rack
    tor_gbps: float = 50.0
    oversubscription: float = 4.0  # cross-pod : ToR
    nvlink_gbps: float = 3600.0
    latency_us: tuple[float, float, float, float] = (1.0, 5.0, 10.0, 20.0)
    aggs_per_pod: int = 2
    cores: int = 2
    background: float = 0.0  # mean background utilisation of the network links
    hotspot_sigma: float = 0.6  # log-normal spread of the links' own background means

    def tier_gbps(self) -> dict[str, float]:
        r = self.oversubscription
        return {
            "node": self.nvlink_gbps,
            "rack": self.tor_gbps,
            "pod": self.tor_gbps / max(1.0, r / 2),
            "cluster": self.tor_gbps / r,
        }


@dataclass
class Instance:
    id: str
    role: str
    pod: int
    rack: int  # global rack index
    server: int  # global server index
    nic_up: list[int] = field(default_factory=list)  # one NIC per GPU of the TP group
    nic_down: list[int] = field(default_factory=list)


@dataclass
class FatTree:
    config: FatTreeConfig
    net: Network
    instances: dict[str, Instance]
    nvlink: dict[int, int]  # server -> link
    tor_up: dict[tuple[int, int], int]  # (rack, agg) -> link
    tor_down: dict[tuple[int, int], int]
    agg_up: dict[tuple[int, int, int], int]  # (pod, agg, core) -> link
    agg_down: dict[tuple[int, int, int], int]
    rng: random.Random = field(default_factory=random.Random)
    physical: list[float] = field(default_factory=list)  # bytes/s per link, before background
    tier_of_link: dict[int, str] = field(default_factory=dict)
    background_mean: dict[int, float] = field(default_factory=dict)  # per network link

    @classmethod
    def build(cls, config: FatTreeConfig, seed: int = 0) -> FatTree:
        net = Network()
        gbps = config.tier_gbps()
        tiers: dict[int, str] = {}

        def link(capacity_gbps: float, tier: str) -> int:
            index = net.add_link(capacity_gbps * 1e9 / 8)
            tiers[index] = tier
            return index

        instances: dict[str, Instance] = {}
        nvlink: dict[int, int] = {}
        per_server = config.gpus_per_server // config.tp
        racks = config.pods * config.racks_per_pod
        for rack in range(racks):
            pod = rack // config.racks_per_pod
            for s in range(config.servers_per_rack):
                server = rack * config.servers_per_rack + s
                nvlink[server] = link(gbps["node"], "node")
                for k in range(per_server):
                    role = "prefill" if server in config.prefill_servers else "decode"
                    iid = f"{'p' if role == 'prefill' else 'd'}{server}.{k}"
                    inst = Instance(iid, role, pod, rack, server)
                    inst.nic_up = [link(config.tor_gbps, "rack") for _ in range(config.tp)]
                    inst.nic_down = [link(config.tor_gbps, "rack") for _ in range(config.tp)]
                    instances[iid] = inst
        r = config.oversubscription
        gpus_rack = config.servers_per_rack * config.gpus_per_server
        gpus_pod = gpus_rack * config.racks_per_pod
        tor_gbps = gpus_rack * config.tor_gbps / max(1.0, r / 2) / config.aggs_per_pod
        core_gbps = gpus_pod * config.tor_gbps / r / (config.aggs_per_pod * config.cores)
        tor_up, tor_down, agg_up, agg_down = {}, {}, {}, {}
        for rack in range(racks):
            for a in range(config.aggs_per_pod):
                tor_up[(rack, a)] = link(tor_gbps, "pod")
                tor_down[(rack, a)] = link(tor_gbps, "pod")
        for pod in range(config.pods):
            for a in range(config.aggs_per_pod):
                for c in range(config.cores):
                    agg_up[(pod, a, c)] = link(core_gbps, "cluster")
                    agg_down[(pod, a, c)] = link(core_gbps, "cluster")
        rng = random.Random(seed)
        physical = list(net.capacity)
        means = {}
        spread = config.hotspot_sigma
        for index, tier in tiers.items():
            if tier == "node" or config.background <= 0:
                continue
            # Log-normal around the configured mean (its median shifted so the mean holds).
            draw = config.background * math.exp(rng.gauss(-spread * spread / 2, spread))
            means[index] = min(0.9, draw)
            net.capacity[index] = physical[index] * (1 - means[index])
        return cls(
            config,
            net,
            instances,
            nvlink,
            tor_up,
            tor_down,
            agg_up,
            agg_down,
            rng,
            physical,
            tiers,
            means,
        )

    def tier(self, a: str, b: str) -> str:
        x, y = self.instances[a], self.instances[b]
        if x.server == y.server:
            return "node"
        if x.rack == y.rack:
            return "rack"
        return "pod" if x.pod == y.pod else "cluster"

    def paths(self, a: str, b: str, rng: random.Random | None = None) -> list[list[int]]:
        """The links of the TP shards' parallel flows from a to b; ECMP drawn per flow
        (from `rng`, else the tree's own)."""
        rng = rng or self.rng
        x, y = self.instances[a], self.instances[b]
        if x.server == y.server:
            return [[self.nvlink[x.server]] for _ in range(self.config.tp)]
        out = []
        for k in range(self.config.tp):
            up, down = x.nic_up[k], y.nic_down[k]
            if x.rack == y.rack:
                out.append([up, down])
                continue
            agg = rng.randrange(self.config.aggs_per_pod)
            if x.pod == y.pod:
                out.append([up, self.tor_up[(x.rack, agg)], self.tor_down[(y.rack, agg)], down])
                continue
            core = rng.randrange(self.config.cores)
            agg2 = rng.randrange(self.config.aggs_per_pod)
            out.append(
                [
                    up,
                    self.tor_up[(x.rack, agg)],
                    self.agg_up[(x.pod, agg, core)],
                    self.agg_down[(y.pod, agg2, core)],
                    self.tor_down[(y.rack, agg2)],
                    down,
                ]
            )
        return out

    def topology(self, congestion: dict[str, float] | None = None) -> Topology:
        """The oracle's view: locality labels, tier bandwidths and latencies."""
        return Topology(
            instances={
                i.id: {"node": f"s{i.server}", "rack": f"r{i.rack}", "pod": f"p{i.pod}"}
                for i in self.instances.values()
            },
            tier_bandwidth=self.config.tier_gbps(),
            tier_latency=dict(
                zip(("node", "rack", "pod", "cluster"), self.config.latency_us, strict=True)
            ),
            congestion=congestion or {},
        )
