"""The NetKV paper's cluster: a multi-tier fat-tree of GPU instances (section VI-A).

Defaults: 2 pods x 2 racks x 2 servers x 8 GPUs, TP=4 (16 instances, 4 prefill and
12 decode; the prefill instances fill one server in each pod, so no decode instance
shares a prefill's NVLink and the choice is among the rack, pod and cross-pod tiers). A lone flow between two instances gets exactly its tier's bandwidth
(each flow is capped at it: the per-flow share the paper's tier bandwidths
describe), while the fabric's links carry what the oversubscription allows in
aggregate: a rack's uplinks 16 GPUs x ToR / max(1, r/2), a pod's core links
32 GPUs x ToR / r, every GPU's NIC the ToR bandwidth. A KV transfer is TP parallel shard flows, GPU to GPU (the paper's
model), each with its own ECMP draw, so tier bandwidths are per GPU pair and
the cost model prices the per-shard payload. Background traffic takes a
fixed fraction of every network link (not NVLink).

The paper's numbers for the tiers were lost in extraction; we use its stated
ratios around a 50 Gbps ToR: pod 25 Gbps (2:1), cross-pod 12.5 Gbps (4:1),
NVLink 450 GB/s. The oversubscription sweep scales pod and cross-pod from the
ToR: cross-pod = ToR / r, pod = ToR / max(1, r/2).
"""

from __future__ import annotations

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
    prefill_servers: tuple[int, ...] = (0, 4)  # whole servers of prefill: one per pod
    tor_gbps: float = 50.0
    oversubscription: float = 4.0  # cross-pod : ToR
    nvlink_gbps: float = 3600.0
    latency_us: tuple[float, float, float, float] = (1.0, 5.0, 10.0, 20.0)
    aggs_per_pod: int = 2
    cores: int = 2
    background: float = 0.0  # fraction of every network link's capacity

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

    @classmethod
    def build(cls, config: FatTreeConfig, seed: int = 0) -> FatTree:
        net = Network()
        gbps = config.tier_gbps()
        bg = 1.0 - config.background

        def link(tier: str, background: bool = True) -> int:
            return net.add_link(gbps[tier] * 1e9 / 8 * (bg if background else 1.0))

        instances: dict[str, Instance] = {}
        nvlink: dict[int, int] = {}
        per_server = config.gpus_per_server // config.tp
        racks = config.pods * config.racks_per_pod
        for rack in range(racks):
            pod = rack // config.racks_per_pod
            for s in range(config.servers_per_rack):
                server = rack * config.servers_per_rack + s
                nvlink[server] = link("node", background=False)
                for k in range(per_server):
                    role = "prefill" if server in config.prefill_servers else "decode"
                    iid = f"{'p' if role == 'prefill' else 'd'}{server}.{k}"
                    inst = Instance(iid, role, pod, rack, server)
                    inst.nic_up = [link("rack") for _ in range(config.tp)]
                    inst.nic_down = [link("rack") for _ in range(config.tp)]
                    instances[iid] = inst
        # Fabric links carry the aggregate a tier is oversubscribed to; each flow is
        # separately capped at its tier's per-flow bandwidth (see `cap`).
        r = config.oversubscription
        gpus_rack = config.servers_per_rack * config.gpus_per_server
        gpus_pod = gpus_rack * config.racks_per_pod
        tor_gbps = gpus_rack * config.tor_gbps / max(1.0, r / 2) / config.aggs_per_pod
        core_gbps = gpus_pod * config.tor_gbps / r / (config.aggs_per_pod * config.cores)
        tor_up, tor_down, agg_up, agg_down = {}, {}, {}, {}
        for rack in range(racks):
            for a in range(config.aggs_per_pod):
                tor_up[(rack, a)] = net.add_link(tor_gbps * 1e9 / 8 * bg)
                tor_down[(rack, a)] = net.add_link(tor_gbps * 1e9 / 8 * bg)
        for pod in range(config.pods):
            for a in range(config.aggs_per_pod):
                for c in range(config.cores):
                    agg_up[(pod, a, c)] = net.add_link(core_gbps * 1e9 / 8 * bg)
                    agg_down[(pod, a, c)] = net.add_link(core_gbps * 1e9 / 8 * bg)
        return cls(
            config, net, instances, nvlink, tor_up, tor_down, agg_up, agg_down, random.Random(seed)
        )

    def cap(self, tier: str) -> float:
        """A flow's ceiling on `tier`, bytes/s: the tier's bandwidth less background."""
        bg = 0.0 if tier == "node" else self.config.background
        return self.config.tier_gbps()[tier] * 1e9 / 8 * (1 - bg)

    def tier(self, a: str, b: str) -> str:
        x, y = self.instances[a], self.instances[b]
        if x.server == y.server:
            return "node"
        if x.rack == y.rack:
            return "rack"
        return "pod" if x.pod == y.pod else "cluster"

    def paths(self, a: str, b: str) -> list[list[int]]:
        """The links of the TP shards' parallel flows from a to b; ECMP drawn per flow."""
        x, y = self.instances[a], self.instances[b]
        if x.server == y.server:
            return [[self.nvlink[x.server]] for _ in range(self.config.tp)]
        out = []
        for k in range(self.config.tp):
            up, down = x.nic_up[k], y.nic_down[k]
            if x.rack == y.rack:
                out.append([up, down])
                continue
            agg = self.rng.randrange(self.config.aggs_per_pod)
            if x.pod == y.pod:
                out.append([up, self.tor_up[(x.rack, agg)], self.tor_down[(y.rack, agg)], down])
                continue
            core = self.rng.randrange(self.config.cores)
            agg2 = self.rng.randrange(self.config.aggs_per_pod)
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
