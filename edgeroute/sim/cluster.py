"""A discrete-event, flow-level simulator of disaggregated serving (NetKV section VI-B).

Requests from a Mooncake-format trace arrive, queue for a prefill instance
(least loaded), prefill, then the decode policy under test picks a decode
instance; the KV cache (only the blocks that instance lacks) crosses the
fat-tree as a flow sharing links max-min fairly with every other transfer; the
decode instance admits it at an iteration boundary when its batch and memory
allow, and decodes. Decode instances keep an LRU cache of prefix blocks.

Decisions use the very same policy objects as the gateway, on a snapshot built
from what a real scheduler could see: per-instance state at the decision, the
oracle's congestion as of its last refresh (every `oracle_interval` seconds),
and this scheduler's own transfers in flight.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from types import MappingProxyType

from edgeroute.sim.fattree import FatTree, FatTreeConfig
from edgeroute.sim.workload import MOONCAKE_BLOCK, TraceRequest, arrivals
from oracle.topology import Topology
from policies import BackendView, ClusterView, PipelineSpec, RequestInfo, build_pipeline

MODEL = "m"
SELF_CONTENTION_CAP = 16


@dataclass(frozen=True)
class ComputeModel:
    """Llama-3-70B at TP=4 on H100-class GPUs, piecewise-linear (fitted-conservative: fast
    decode, so the network is a smaller share of TTFT)."""

    prefill_base: float = 0.02
    prefill_per_token: float = 0.00004
    iter_base: float = 0.010
    iter_per_seq: float = 0.00005
    max_batch: int = 256
    kv_bytes_per_token: float = 327_680.0  # all TP shards together (80 KB each at TP=4)
    kv_capacity_tokens: int = 500_000  # ~160 GB of free HBM over 4 GPUs
    cache_blocks: int = 600  # LRU prefix cache per decode instance, 512-token blocks
    reserve_tokens: int = 2048

    def prefill_time(self, tokens: int) -> float:
        return self.prefill_base + self.prefill_per_token * tokens

    def iteration_time(self, batch: int) -> float:
        return self.iter_base + self.iter_per_seq * batch


@dataclass(frozen=True)
class SimConfig:
    scheduler: PipelineSpec
    rate: float  # requests per second
    tree: FatTreeConfig = field(default_factory=FatTreeConfig)
    compute: ComputeModel = field(default_factory=ComputeModel)
    warmup: float = 5.0
    measure: float = 15.0
    oracle_interval: float = 1.0
    slo_s: float = 5.0
    seed: int = 0
    trace_start: float = 0.0  # where in the trace arrivals begin (trace seconds)
    bg_wave: float = 0.0  # background fluctuation, as a fraction of the background
    bg_period: float = 10.0


@dataclass(eq=False)
class Request:
    id: int
    arrival: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]
    prefill: str = ""
    decode: str = ""
    tier: str = ""
    prefill_done: float = math.nan
    xfer_start: float = math.nan
    xfer_end: float = math.nan
    first_token: float = math.nan
    finished: float = math.nan
    generated: int = 0
    decode_time: float = 0.0  # sum of iteration times after the first token
    rejected: bool = False

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def tbt(self) -> float:
        return self.decode_time / (self.generated - 1) if self.generated > 1 else math.nan

    @property
    def transfer(self) -> float:
        return self.xfer_end - self.xfer_start

    @property
    def need(self) -> int:
        return self.input_len + self.output_len


@dataclass(eq=False)
class Prefill:
    id: str
    queue: deque[Request] = field(default_factory=deque)
    busy: bool = False


@dataclass(eq=False)
class Decode:
    id: str
    running: list[Request] = field(default_factory=list)
    waiting: deque[Request] = field(default_factory=deque)
    incoming: int = 0  # transfers in flight to it
    used_tokens: int = 0
    cache: OrderedDict[int, None] = field(default_factory=OrderedDict)
    busy: bool = False


class Simulator:
    def __init__(self, config: SimConfig, trace: list[TraceRequest]) -> None:
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.tree = FatTree.build(config.tree, seed=config.seed)
        self.net = self.tree.net
        self.compute = config.compute
        self.prefills = {
            i.id: Prefill(i.id) for i in self.tree.instances.values() if i.role == "prefill"
        }
        self.decodes = {
            i.id: Decode(i.id) for i in self.tree.instances.values() if i.role == "decode"
        }
        self.decode_pipeline = build_pipeline(config.scheduler)
        self.prefill_pipeline = build_pipeline(
            PipelineSpec(policy="least_load", filters=["prefill_role", "serves_model", "healthy"])
        )
        self.contention: dict[tuple[str, str], int] = {}
        self.events: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self.now = 0.0
        self.oracle = self.tree.topology(self._congestion(0.0))
        self.requests: list[Request] = []
        self._shards_left: dict[int, int] = {}
        horizon = config.warmup + config.measure
        for i, tr in enumerate(arrivals(trace, config.rate, config.trace_start, horizon)):
            req = Request(i, tr.t, tr.input_len, max(1, tr.output_len), tr.hash_ids)
            self.requests.append(req)
            self._at(tr.t, "arrive", req)
        self._at(0.0, "oracle", None)
        if config.bg_wave > 0:
            self._base_capacity = list(self.net.capacity)
            self._link_tier = self._classify_links()
            self._at(0.0, "background", None)

    # -- background traffic and the oracle -------------------------------------------

    def _background(self, tier: str, t: float) -> float:
        bg = self.cfg.tree.background
        if self.cfg.bg_wave <= 0 or tier == "node":
            return bg if tier != "node" else 0.0
        phase = {"rack": 0.0, "pod": 2.1, "cluster": 4.2}[tier]
        wave = math.sin(2 * math.pi * t / self.cfg.bg_period + phase)
        return min(0.95, max(0.0, bg * (1 + self.cfg.bg_wave * wave)))

    def _congestion(self, t: float) -> dict[str, float]:
        """What the operator's telemetry reports: background utilisation per tier."""
        return {tier: self._background(tier, t) for tier in ("rack", "pod", "cluster")}

    def _classify_links(self) -> dict[int, str]:
        tiers: dict[int, str] = {}
        for link in self.tree.nvlink.values():
            tiers[link] = "node"
        for inst in self.tree.instances.values():
            for link in [*inst.nic_up, *inst.nic_down]:
                tiers[link] = "rack"
        for link in [*self.tree.tor_up.values(), *self.tree.tor_down.values()]:
            tiers[link] = "pod"
        for link in [*self.tree.agg_up.values(), *self.tree.agg_down.values()]:
            tiers[link] = "cluster"
        return tiers

    # -- the event loop -------------------------------------------------------------

    def _at(self, t: float, kind: str, obj: object) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, obj))

    def run(self, max_time: float = 600.0) -> list[Request]:
        measured = [r for r in self.requests if r.arrival >= self.cfg.warmup]
        while self.events or self.net.flows:
            t_event = self.events[0][0] if self.events else math.inf
            t_flow = self.net.next_completion()
            if min(t_event, t_flow) > max_time:
                break
            if t_flow <= t_event:
                self.now = t_flow
                for flow in self.net.advance(t_flow):
                    self._transfer_done(flow.tag)  # type: ignore[arg-type]
                continue
            t, _, kind, obj = heapq.heappop(self.events)
            self.now = t
            self.net.advance(t)
            getattr(self, f"_on_{kind}")(obj)
            if (
                kind == "oracle"
                and all(not math.isnan(r.finished) or r.rejected for r in measured)
                and t > self.cfg.warmup
            ):
                break
        return measured

    def _on_oracle(self, _: object) -> None:
        self.oracle = self.tree.topology(self._congestion(self.now))
        self._at(self.now + self.cfg.oracle_interval, "oracle", None)

    def _on_background(self, _: object) -> None:
        for link, tier in self._link_tier.items():
            if tier != "node":
                self.net.capacity[link] = (
                    self._base_capacity[link]
                    / (1 - self.cfg.tree.background)
                    * (1 - self._background(tier, self.now))
                )
        self.net._allocate()
        self._at(self.now + 0.1, "background", None)

    # -- prefill --------------------------------------------------------------------------

    def _on_arrive(self, req: Request) -> None:
        views = tuple(
            BackendView(
                id=p.id,
                role="prefill",
                models=frozenset({MODEL}),
                stats_age=0.0,
                running=1 if p.busy else 0,
                waiting=len(p.queue),
            )
            for p in self.prefills.values()
        )
        decision = self.prefill_pipeline.decide(self._info(req), ClusterView(views))
        assert decision.backend_id is not None
        p = self.prefills[decision.backend_id]
        req.prefill = p.id
        p.queue.append(req)
        self._start_prefill(p)

    def _start_prefill(self, p: Prefill) -> None:
        if p.busy or not p.queue:
            return
        req = p.queue.popleft()
        p.busy = True
        self._at(self.now + self.compute.prefill_time(req.input_len), "prefill_done", req)

    def _on_prefill_done(self, req: Request) -> None:
        p = self.prefills[req.prefill]
        p.busy = False
        req.prefill_done = self.now
        self._start_prefill(p)
        self._dispatch(req)

    # -- decode choice and the KV transfer ---------------------------------------------

    def _info(self, req: Request, prefill: str | None = None) -> RequestInfo:
        return RequestInfo(
            model=MODEL,
            prompt_tokens=req.input_len,
            block_hashes=req.hash_ids,
            seq=req.id,
            entropy=self.rng.getrandbits(63),
            prefill_id=prefill,
        )

    def _view(self) -> ClusterView:
        c = self.compute
        views = tuple(
            BackendView(
                id=d.id,
                role="decode",
                models=frozenset({MODEL}),
                stats_age=0.0,
                running=len(d.running),
                waiting=len(d.waiting) + d.incoming,
                kv_usage=d.used_tokens / c.kv_capacity_tokens,
                cached_blocks=d.cache.keys(),
                kv_capacity_tokens=c.kv_capacity_tokens,
                max_batch=c.max_batch,
                iter_base=c.iter_base,
                iter_per_seq=c.iter_per_seq,
                kv_bytes_per_token=c.kv_bytes_per_token / self.cfg.tree.tp,
            )  # per shard
            for d in self.decodes.values()
        )
        return ClusterView(
            views,
            stale_after=math.inf,
            oracle=self.oracle,
            self_contention=MappingProxyType(dict(self.contention)),
            block_tokens=MOONCAKE_BLOCK,
        )

    def _dispatch(self, req: Request) -> None:
        decision = self.decode_pipeline.decide(self._info(req, req.prefill), self._view())
        if decision.backend_id is None:
            req.rejected = True
            return
        d = self.decodes[decision.backend_id]
        req.decode = d.id
        req.tier = self.tree.tier(req.prefill, d.id)
        hit = 0
        for h in req.hash_ids:
            if h not in d.cache:
                break
            hit += 1
        payload = self.compute.kv_bytes_per_token * max(0, req.input_len - hit * MOONCAKE_BLOCK)
        key = (req.prefill, req.tier)
        self.contention[key] = min(SELF_CONTENTION_CAP, self.contention.get(key, 0) + 1)
        d.incoming += 1
        req.xfer_start = self.now
        latency = self.oracle.tier_latency[req.tier] * 1e-6
        if payload <= 0:
            self._at(self.now + latency, "landed", req)
            return
        shards = self.tree.paths(req.prefill, d.id)
        self._shards_left[req.id] = len(shards)
        bg = self._background(req.tier, self.now)
        cap = self.tree.config.tier_gbps()[req.tier] * 1e9 / 8 * (1 - bg)
        for path in shards:
            self.net.add_flow(path, payload / len(shards), (req, latency), cap=cap)

    def _transfer_done(self, tag: tuple[Request, float]) -> None:
        req, latency = tag
        self._shards_left[req.id] -= 1
        if self._shards_left[req.id] == 0:  # the last shard has landed
            del self._shards_left[req.id]
            self._at(self.now + latency, "landed", req)

    def _on_landed(self, req: Request) -> None:
        key = (req.prefill, req.tier)
        left = self.contention.get(key, 0) - 1
        if left > 0:
            self.contention[key] = left
        else:
            self.contention.pop(key, None)
        d = self.decodes[req.decode]
        d.incoming -= 1
        req.xfer_end = self.now
        d.waiting.append(req)
        self._iterate(d)

    # -- continuous batching --------------------------------------------------------------

    def _iterate(self, d: Decode) -> None:
        if d.busy:
            return
        c = self.compute
        while (
            d.waiting
            and len(d.running) < c.max_batch
            and (d.used_tokens + d.waiting[0].need <= c.kv_capacity_tokens)
        ):
            req = d.waiting.popleft()
            d.used_tokens += req.need
            d.running.append(req)
            for h in req.hash_ids:
                d.cache[h] = None
                d.cache.move_to_end(h)
            while len(d.cache) > c.cache_blocks:
                d.cache.popitem(last=False)
        if not d.running:
            return
        d.busy = True
        dt = c.iteration_time(len(d.running))
        self._at(self.now + dt, "iteration", (d, dt))

    def _on_iteration(self, obj: tuple[Decode, float]) -> None:
        d, dt = obj
        d.busy = False
        still = []
        for req in d.running:
            req.generated += 1
            if math.isnan(req.first_token):
                req.first_token = self.now
            else:
                req.decode_time += dt
            if req.generated >= req.output_len:
                req.finished = self.now
                d.used_tokens -= req.need
            else:
                still.append(req)
        d.running = still
        self._iterate(d)


def simulate(config: SimConfig, trace: list[TraceRequest]) -> list[Request]:
    return Simulator(config, trace).run()


def topology_of(config: FatTreeConfig) -> Topology:
    return FatTree.build(config).topology()


def capacity(trace: list[TraceRequest], config: SimConfig, utilisation: float = 0.35) -> float:
    """The request rate we call 100% load: `utilisation` of the tighter of two bounds,
    the prefill pool's compute and its NICs' egress for the workload's mean KV payload."""
    tree = FatTree.build(config.tree)
    n_prefill = sum(1 for i in tree.instances.values() if i.role == "prefill")
    mean_in = sum(r.input_len for r in trace) / len(trace)
    compute_bound = n_prefill / config.compute.prefill_time(int(mean_in))
    nic = config.tree.tp * config.tree.tier_gbps()["rack"] * 1e9 / 8 * (1 - config.tree.background)
    egress_bound = n_prefill * nic / (mean_in * config.compute.kv_bytes_per_token)
    return utilisation * min(compute_bound, egress_bound)
