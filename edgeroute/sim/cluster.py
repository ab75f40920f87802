"""A discrete-event, flow-level simulator of disaggregated serving (NetKV section VI-B).

Requests from a Mooncake-format trace arrive, queue for a prefill instance
(least loaded), prefill, then the decode policy under test picks a decode
instance; the KV cache (only the blocks that instance lacks) crosses the
fat-tree as flows sharing links max-min fairly with every other flow; the
decode instance admits it at an iteration boundary when its batch and memory
allow, and decodes. Decode instances keep an LRU cache of prefix blocks.

The world is not the policy's model of it:
- a flow gets what its links give it (no tier caps: `sim.fattree`);
- every network link has its own background utilisation, which wanders around the
  link's mean (an Ornstein-Uhlenbeck walk), and elephant flows (long transfers between
  random GPUs of different pods) come and go as real flows;
- the oracle sees only the operator's telemetry: per-tier utilisation (the mean over
  the tier's links of everything they carry, our own transfers included) sampled every
  `oracle_interval` seconds, delivered `telemetry_delay` seconds later, with
  multiplicative noise;
- a decode iteration reads the weights and the batch's whole KV cache, so it slows
  with the batch's context (`ComputeModel`), where NetKV's cost model assumes a fixed
  time plus a term per sequence.

Decisions use the very same policy objects as the gateway, on a snapshot built
from what a real scheduler could see: per-instance state at the decision, the
oracle as of its last telemetry, and this scheduler's own transfers in flight
(released when a transfer completes).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from edgeroute.sim.fattree import FatTree, FatTreeConfig
from edgeroute.sim.network import Flow
from edgeroute.sim.workload import MOONCAKE_BLOCK, TraceRequest, arrivals
from oracle.topology import Topology
from policies import BackendView, ClusterView, PipelineSpec, RequestInfo, build_pipeline

MODEL = "m"
SELF_CONTENTION_CAP = 16


@dataclass(frozen=True)
class ComputeModel:
    """Llama-3-70B (fp16) at TP=4 on H100 SXM GPUs.

    A decode iteration is a roofline from the published specifications, piecewise
    linear: the larger of reading the GPU's weight shard and the batch's KV cache from
    HBM (3.35 TB/s, at `hbm_efficiency`) and the batch's matrix work (989 dense fp16
    TFLOPS, at `mfu`), plus a fixed launch overhead. The KV cache per token is
    Llama-3-70B's (80 layers x 8 KV heads x 128 x 2 x 2 bytes = 327,680 bytes over the
    TP shards). Free KV memory is what 80 GB per GPU leaves after the 35 GB weight
    shard and 5 GB of activations. The prefill time stays the earlier fit (fast, so
    the network is a smaller share of TTFT).
    """

    prefill_base: float = 0.02
    prefill_per_token: float = 0.00004
    weights_bytes_per_gpu: float = 35e9
    hbm_bytes_per_s: float = 3.35e12
    hbm_efficiency: float = 0.7
    flops_per_token: float = 2 * 70e9
    gpu_flops: float = 989e12
    mfu: float = 0.4
    tp: int = 4
    launch_s: float = 0.002
    max_batch: int = 256
    kv_bytes_per_token: float = 327_680.0  # all TP shards together (80 KB each at TP=4)
    kv_capacity_tokens: int = 488_000  # 4 x 40 GB free / 327,680 bytes
    cache_blocks: int = 600  # LRU prefix cache per decode instance, 512-token blocks
    reserve_tokens: int = 2048

    def prefill_time(self, tokens: int) -> float:
        return self.prefill_base + self.prefill_per_token * tokens

    def iteration_time(self, batch: int, context_tokens: int) -> float:
        hbm = self.hbm_bytes_per_s * self.hbm_efficiency
        memory = (
            self.weights_bytes_per_gpu + context_tokens * self.kv_bytes_per_token / self.tp
        ) / hbm
        compute = batch * self.flops_per_token / (self.tp * self.gpu_flops * self.mfu)
        return self.launch_s + max(memory, compute)

    @property
    def iter_base(self) -> float:
        """The scheduler's profile of an iteration (NetKV's T_step): an empty batch's
        time ..."""
        return self.iteration_time(0, 0)

    @property
    def iter_per_seq(self) -> float:
        """... plus this per sequence (the compute slope; it ignores the context)."""
        return self.flops_per_token / (self.tp * self.gpu_flops * self.mfu)


@dataclass(frozen=True)
class SimConfig:
    scheduler: PipelineSpec
    rate: float  # requests per second
    tree: FatTreeConfig = field(default_factory=FatTreeConfig)
    compute: ComputeModel = field(default_factory=ComputeModel)
    warmup: float = 5.0
    measure: float = 15.0
    oracle_interval: float = 1.0  # the telemetry's sampling period, delta
    telemetry_delay: float = 1.0  # seconds from a sample to the oracle
    telemetry_noise: float = 0.1  # relative error of a reported utilisation (1 sigma)
    slo_s: float = 5.0
    seed: int = 0
    trace_start: float = 0.0  # where in the trace arrivals begin (trace seconds)
    bg_volatility: float = 0.5  # of each link's background around its mean, per sqrt(s)
    bg_step: float = 0.5  # seconds between background updates
    elephants: int = 4  # concurrent long flows between GPUs of different pods, on average
    elephant_on_s: float = 5.0  # mean duration of one


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
        self.oracle = self.tree.topology({})
        self.requests: list[Request] = []
        self._shards_left: dict[int, int] = {}
        self.memory_blocked = 0  # admissions that waited for KV memory
        horizon = config.warmup + config.measure
        for i, tr in enumerate(arrivals(trace, config.rate, config.trace_start, horizon)):
            req = Request(i, tr.t, tr.input_len, max(1, tr.output_len), tr.hash_ids)
            self.requests.append(req)
            self._at(tr.t, "arrive", req)
        # The world's own randomness, apart from the policies' tie-breaks.
        self.world = random.Random(config.seed * 7919 + 1)
        self.background = dict(self.tree.background_mean)
        self._at(0.0, "telemetry", None)
        if self.background:  # a loaded fabric: wandering background and elephants
            self._at(0.0, "background", None)
            for _ in range(config.elephants):
                self._at(self.world.expovariate(1 / config.elephant_on_s), "elephant", None)

    # -- the world around the transfers: background, elephants, telemetry --------------

    def _on_background(self, _: object) -> None:
        """Each link's background wanders around its own mean (Ornstein-Uhlenbeck)."""
        dt = self.cfg.bg_step
        sigma = self.cfg.bg_volatility * math.sqrt(dt)
        for link, mean in self.tree.background_mean.items():
            b = self.background[link]
            b += (mean - b) * min(1.0, dt) + sigma * mean * self.world.gauss(0.0, 1.0)
            self.background[link] = b = min(0.95, max(0.0, b))
            self.net.capacity[link] = self.tree.physical[link] * (1 - b)
        self.net.reallocate()
        self._at(self.now + dt, "background", None)

    def _on_elephant(self, flow: Flow | None) -> None:
        """An elephant starts (or, given one, ends and another is scheduled)."""
        if flow is not None:
            self.net.remove(flow)
            self._at(
                self.now + self.world.expovariate(1 / self.cfg.elephant_on_s), "elephant", None
            )
            return
        ids = list(self.tree.instances)
        a = self.tree.instances[self.world.choice(ids)]
        far = [i for i in ids if self.tree.instances[i].pod != a.pod]
        if not far:
            return
        b = self.world.choice(far)
        path = self.world.choice(self.tree.paths(a.id, b, self.world))
        flow = self.net.add_flow(path, 1e18, "elephant")
        self._at(self.now + self.world.expovariate(1 / self.cfg.elephant_on_s), "elephant", flow)

    def utilisation(self) -> dict[str, float]:
        """What switch counters show: per tier, the mean over its links of the share of
        the physical capacity in use (background, elephants and our transfers alike)."""
        used: dict[str, list[float]] = {}
        rates = self.net.link_rates()
        for link, tier in self.tree.tier_of_link.items():
            if tier == "node":
                continue
            physical = self.tree.physical[link]
            busy = self.background.get(link, 0.0) * physical + rates.get(link, 0.0)
            used.setdefault(tier, []).append(min(1.0, busy / physical))
        return {tier: sum(v) / len(v) for tier, v in used.items()}

    def _on_telemetry(self, _: object) -> None:
        noise = self.cfg.telemetry_noise
        sample = {
            tier: min(0.99, max(0.0, u * (1 + self.world.gauss(0.0, noise))))
            for tier, u in self.utilisation().items()
        }
        self._at(self.now + self.cfg.telemetry_delay, "oracle", sample)
        self._at(self.now + self.cfg.oracle_interval, "telemetry", None)

    def _on_oracle(self, sample: dict[str, float]) -> None:
        self.oracle = self.tree.topology(sample)

    # -- the event loop -------------------------------------------------------------

    def _at(self, t: float, kind: str, obj: object) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, obj))

    def run(self, max_time: float = 600.0) -> list[Request]:
        measured = [r for r in self.requests if r.arrival >= self.cfg.warmup]
        while self.events:
            t_event = self.events[0][0]
            t_flow = self.net.next_completion()
            if min(t_event, t_flow) > max_time:
                break
            if t_flow <= t_event:
                self.now = t_flow
                for flow in self.net.advance(t_flow):
                    if flow.tag != "elephant":
                        self._transfer_done(flow.tag)  # type: ignore[arg-type]
                continue
            t, _, kind, obj = heapq.heappop(self.events)
            self.now = t
            self.net.advance(t)
            getattr(self, f"_on_{kind}")(obj)
            if (
                kind == "telemetry"
                and t > self.cfg.warmup
                and all(not math.isnan(r.finished) or r.rejected for r in measured)
            ):
                break
        return measured

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
        for path in shards:
            self.net.add_flow(path, payload / len(shards), (req, latency))

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
        while d.waiting and len(d.running) < c.max_batch:
            if d.used_tokens + d.waiting[0].need > c.kv_capacity_tokens:
                self.memory_blocked += 1
                break
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
        context = sum(r.input_len + r.generated for r in d.running)
        dt = c.iteration_time(len(d.running), context)
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


def bound(trace: list[TraceRequest], config: SimConfig) -> float:
    """An upper bound on the sustainable request rate: the tighter of the prefill pool's
    compute and its NICs' egress for the workload's mean KV payload."""
    tree = FatTree.build(config.tree)
    n_prefill = sum(1 for i in tree.instances.values() if i.role == "prefill")
    mean_in = sum(r.input_len for r in trace) / len(trace)
    compute_bound = n_prefill / config.compute.prefill_time(int(mean_in))
    nic = config.tree.tp * config.tree.tor_gbps * 1e9 / 8
    egress_bound = n_prefill * nic / (mean_in * config.compute.kv_bytes_per_token)
    return min(compute_bound, egress_bound)


def attainment(requests: list[Request], slo: float) -> float:
    """The share of requests whose first token came within the TTFT SLO."""
    if not requests:
        return math.nan
    return sum(r.ttft <= slo for r in requests if not math.isnan(r.first_token)) / len(requests)


def capacity(
    trace: list[TraceRequest],
    config: SimConfig,
    target: float = 0.9,
    seeds: int = 2,
    probes: int = 7,
) -> float:
    """The request rate we call 100% load, measured: the highest rate at which
    least-loaded decode placement (`config.scheduler` is not used) meets the TTFT SLO
    for `target` of the requests, found by bisection, each probe over `seeds` runs."""
    probe = replace(config, scheduler=PipelineSpec(policy="decode_la"))
    lo, hi = 0.0, bound(trace, config)
    for _ in range(probes):
        mid = (lo + hi) / 2
        runs = [
            attainment(simulate(replace(probe, rate=mid, seed=config.seed + k), trace), probe.slo_s)
            for k in range(seeds)
        ]
        if statistics.fmean(runs) >= target:
            lo = mid
        else:
            hi = mid
    return lo
