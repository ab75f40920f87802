"""The QoS-DRL training environment: N heterogeneous edge experts (the QoS paper, section IV).

Each expert runs iteration-level scheduling with a running and a waiting queue (5 + 5
by default), GPU memory that grows with every request's tokens, and iteration time
`base + k1 * prefill tokens + k2 * decode-batch context` (eq. 13-14); optionally
(`prefix_cache`) each keeps the emulated worker's prefix cache, so that a prompt it has
seen skips the prefill of its cached blocks, as the live run's engines do. A request is
a real prompt from `router_quality/`: each expert answers it with its model's real
length and score. Requests arrive by a Poisson process, at the instants of a trace
(Azure LLM format) or as a live run's stream replayed. The router sees each arrival and
chooses {drop, expert 1..N}.

QoS (eq. 1): phi = score * [latency per token <= L]. The reward (eq. 16) adds the QoS of
every request completed since the last decision and subtracts, for the chosen expert,
the predicted QoS of running requests that the action impact estimator (eq. 13-15)
expects to cross L.
"""

from __future__ import annotations

import copy
import errno
import functools
import hashlib
import math
import random
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import numpy as np

from edgeroute.sim.timeline import Job, finish_times, fits, iteration_end
from edgeroute.sim.workload import TraceRequest
from policies.prefix_cache import PrefixCache, skipped
from policies.qos_state import (
    Arrivals,
    encode,
    progress_share,
    snapshot,
    token_latency_mix,
    with_speed_prior,
)
from policies.text import block_hashes
from policies.types import BackendView, ClusterView, InflightRequest, RequestInfo
from workers.profiles import EXPERTS, PROFILES
from workers.quality import ROUTERDC_MODELS, Sample, iter_routerdc_samples, iter_samples

if TYPE_CHECKING:
    from policies.predictor import ScorePredictor

BUCKETS = 10
MAX_TOKENS = 300  # the paper's generation limit
MAX_PROMPT_TOKENS = 1500  # so that the smallest expert (2048 tokens of KV) can hold any
# RouterBench's 11 models, open ones first: an expert is a model on some edge hardware.
MODELS = (
    "mistralai/mistral-7b-chat",
    "WizardLM/WizardLM-13B-V1.2",
    "mistralai/mixtral-8x7b-chat",
    "zero-one-ai/Yi-34B-Chat",
    "meta/code-llama-instruct-34b-chat",
    "meta/llama-2-70b-chat",
    "gpt-3.5-turbo-1106",
    "claude-instant-v1",
    "claude-v1",
    "claude-v2",
    "gpt-4-1106-preview",
)
# Where a request's quality comes from: RouterBench's MBPP answers (0/1 per prompt and
# model) or RouterDC's free-form tasks (graded: the share of 10 sampled answers that
# were right). Each has its own models, predictor and agents.
Quality = Literal["routerbench", "routerdc"]
QUALITY_MODELS: dict[str, tuple[str, ...]] = {"routerbench": MODELS, "routerdc": ROUTERDC_MODELS}


@dataclass(frozen=True)
class EdgeExpert:
    model: str
    base: float  # s per iteration
    k1: float  # s per prefill token
    k2: float  # s per context token in the decode batch
    memory_tokens: int  # C_n, in tokens of KV cache
    running_cap: int = 5
    waiting_cap: int = 5
    block_size: int = 16  # tokens per KV block, as its prefix cache keys prompts


# Hardware is split like the prompts: agents train on experts drawn from these seeds,
# and are evaluated on others (seed 0, the benchmark's default, and HELD_OUT_HARDWARE).
TRAIN_HARDWARE = range(1, 10_001)


def held_out_hardware(k: int) -> int:
    """The hardware seed of the k-th held-out draw (k >= 0): none is a training seed."""
    return 20_001 + k


HELD_OUT_HARDWARE = tuple(held_out_hardware(k) for k in range(10))


# Base milliseconds per iteration of the benchmark's experts (one RTX 4090-class GPU each).
BASE_MS = (10.0, 22.0)


def check_range(pair: tuple[float, float], what: str) -> None:
    """Refuse `pair` unless it is a range low then high, above 0 (ValueError naming
    `what`): one rule for every such setting, in code and on the command line."""
    low, high = pair
    if not 0 < low <= high:
        raise ValueError(f"expected {what} low then high, above 0, not {low:g},{high:g}")


@dataclass(frozen=True)
class Fleet:
    """How a world's experts are drawn, one definition for training and benchmarks: the
    range of base ms per iteration, and each engine's batch cap, KV memory and waiting
    room. The defaults are the paper's (5 running, 5 waiting, 2-6K tokens); large caps
    and memory make the live engines' regime, where an added request slows a big batch."""

    hardware_ms: tuple[float, float] = BASE_MS
    running_cap: int = 5
    waiting_cap: int = 5
    memory_tokens: int | None = None  # None: each hardware seed's own, 2-6K

    def __post_init__(self) -> None:
        check_range(self.hardware_ms, "the experts' base ms per iteration")

    @classmethod
    def from_record(cls, config: dict[str, Any]) -> Fleet:
        """The fleet a training record's config names (records from before the fleet
        was one setting hold its fields flat, with None for the default hardware)."""
        fields = config.get("fleet", config)
        default = cls()
        return cls(
            hardware_ms=tuple(fields.get("hardware_ms") or default.hardware_ms),
            running_cap=int(fields.get("running_cap", default.running_cap)),
            waiting_cap=int(fields.get("waiting_cap", default.waiting_cap)),
            memory_tokens=fields.get("memory_tokens", default.memory_tokens),
        )

    def flags(self) -> str:
        """The command-line options that select this fleet ("" for the paper's)."""
        default, out = Fleet(), []
        if self.hardware_ms != default.hardware_ms:
            out.append(f" --hardware-ms {self.hardware_ms[0]:g},{self.hardware_ms[1]:g}")
        if self.running_cap != default.running_cap:
            out.append(f" --running-cap {self.running_cap}")
        if self.memory_tokens != default.memory_tokens:
            out.append(f" --memory-tokens {self.memory_tokens}")
        if self.waiting_cap != default.waiting_cap:
            out.append(f" --waiting-cap {self.waiting_cap}")
        return "".join(out)

    def suffix(self) -> str:
        """What a results file's name takes for this fleet: nothing for the paper's."""
        if self == Fleet():
            return ""
        low, high = self.hardware_ms
        memory = "seed" if self.memory_tokens is None else str(self.memory_tokens)
        return f"_fleet-{low:g}-{high:g}ms-b{self.running_cap}-m{memory}-w{self.waiting_cap}"

    def describe(self) -> str:
        """The fleet in words, for results and model cards."""
        memory = (
            "2-6K tokens of KV per hardware seed"
            if self.memory_tokens is None
            else f"{self.memory_tokens} tokens of KV"
        )
        low, high = self.hardware_ms
        return (
            f"base {low:g}-{high:g} ms per iteration, batches of up to {self.running_cap}, "
            f"{memory}, up to {self.waiting_cap} waiting"
        )


def default_experts(
    n: int,
    seed: int = 0,
    models: tuple[str, ...] = MODELS,
    fleet: Fleet = Fleet(),
) -> list[EdgeExpert]:
    """N experts of `fleet`: `models` cycled, hardware drawn once per seed. Any fleet
    draws the same random numbers, so a seed's other constants do not depend on it."""
    rng = random.Random(seed)
    low, high = fleet.hardware_ms
    experts = []
    for i in range(n):
        base = rng.uniform(low / 1000, high / 1000)
        k1, k2 = rng.uniform(0.00008, 0.0002), rng.uniform(1e-6, 4e-6)
        memory = rng.choice((2048, 3072, 4096, 6144))
        experts.append(
            EdgeExpert(
                models[i % len(models)],
                base=base,
                k1=k1,
                k2=k2,
                memory_tokens=fleet.memory_tokens or memory,
                running_cap=fleet.running_cap,
                waiting_cap=fleet.waiting_cap,
            )
        )
    return experts


# The live engines' waiting queue is unbounded; the simulator's needs a bound.
ENGINE_WAITING_CAP = 1000


def engine_fleet(models: tuple[str, ...] = MODELS, n: int = len(EXPERTS)) -> list[tuple[str, str]]:
    """The emulated engines of `bench qos --live` as (profile in `workers.profiles`,
    model it answers as): the six profiles and `models`, each cycled; one rule for the
    live workers and the simulator's `engine_experts`."""
    return [(EXPERTS[i % len(EXPERTS)], models[i % len(models)]) for i in range(n)]


def engine_experts(models: tuple[str, ...] = MODELS, n: int = len(EXPERTS)) -> list[EdgeExpert]:
    """The `n` emulated engines of `bench qos --live` (`engine_fleet`) as the
    simulator's experts: each profile's own time constants, batch cap and KV memory.
    Hardware no agent trained on, drawn by nobody: a check that the simulator ranks
    policies as the live run does."""
    experts = []
    for name, model in engine_fleet(models, n):
        p = PROFILES[name]
        experts.append(
            EdgeExpert(
                model,
                base=p.base,
                k1=p.k1,
                k2=p.k2,
                memory_tokens=p.kv_blocks * p.block_size,
                running_cap=p.max_batch,
                waiting_cap=ENGINE_WAITING_CAP,
                block_size=p.block_size,
            )
        )
    return experts


@dataclass(frozen=True)
class Task:
    """One prompt and every model's real answer to it."""

    prompt: str
    prompt_tokens: int
    scores: dict[str, float]
    lengths: dict[str, int]


# Free-form generation tasks only by default: the multiple-choice ones answer in one or
# two tokens, so their latency per token is their TTFT and eq. 1 degenerates. The paper's
# workload (mix-instruct) is free-form.
FREE_FORM = ("mbpp",)


Split = Literal["predictor", "agent", "eval", "all"]
# Prompts are split three ways by a fixed hash: the score and length predictor trains on
# the share at or above PREDICTOR_SHARE; of the rest, the agent trains on the lower half
# and is evaluated on the upper half, so neither sees a prompt the predictor learnt.
PREDICTOR_SHARE = 0.2


def prompt_share(prompt: str) -> float:
    """The prompt's fixed place in [0, 1], where the splits cut."""
    return int(hashlib.sha1(prompt.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def in_split(prompt: str, split: Split) -> bool:
    h = prompt_share(prompt)
    if split == "predictor":
        return h >= PREDICTOR_SHARE
    if split == "agent":
        return h < PREDICTOR_SHARE / 2
    if split == "eval":
        return PREDICTOR_SHARE / 2 <= h < PREDICTOR_SHARE
    return True


def load_tasks(
    data_dir: Path,
    models: tuple[str, ...] = MODELS,
    kinds: tuple[str, ...] | None = FREE_FORM,
    split: Split = "all",
    quality: Quality = "routerbench",
) -> list[Task]:
    """The prompts of `split` that every model of `models` answered; with `quality`
    routerdc, RouterDC's (`routerdc_tasks`; `models` and `kinds` then do not apply)."""
    quality_dir = data_dir / "router_quality"
    if not quality_dir.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no quality data", str(quality_dir))
    if quality == "routerdc":
        return [t for t in routerdc_tasks(data_dir) if in_split(t.prompt, split)]
    by_prompt: dict[str, dict[str, tuple[float, int, int]]] = {}
    for s in iter_samples(data_dir):
        if s.model in models and (kinds is None or s.task in kinds):
            ptoks = max(1, (len(s.prompt) + 3) // 4)
            by_prompt.setdefault(s.prompt, {})[s.model] = (
                s.score,
                min(s.tokens, MAX_TOKENS),
                ptoks,
            )
    tasks = []
    for prompt, answers in by_prompt.items():
        if all(m in answers for m in models) and in_split(prompt, split):
            ptoks = next(iter(answers.values()))[2]
            tasks.append(
                Task(
                    prompt,
                    min(ptoks, MAX_PROMPT_TOKENS),
                    {m: a[0] for m, a in answers.items()},
                    {m: max(1, a[1]) for m, a in answers.items()},
                )
            )
    return tasks


def routerdc_tasks(data_dir: Path) -> list[Task]:
    """RouterDC's free-form prompts with each of its seven models' real score and the
    stand-in length (`workers.quality.iter_routerdc_samples`), capped as RouterBench's."""
    by_prompt: dict[str, dict[str, Sample]] = {}
    for sample in iter_routerdc_samples(data_dir):
        by_prompt.setdefault(sample.prompt, {})[sample.model] = sample
    return [
        Task(
            prompt,
            min(MAX_PROMPT_TOKENS, max(1, (len(prompt) + 3) // 4)),
            {m: a.score for m, a in answers.items()},
            {m: min(MAX_TOKENS, max(1, a.tokens)) for m, a in answers.items()},
        )
        for prompt, answers in by_prompt.items()
    ]


def bucket(value: float, top: float) -> int:
    return min(BUCKETS - 1, max(0, int(value / top * BUCKETS)))


def bucket_value(b: int, top: float) -> float:
    """A bucket's midpoint."""
    return (b + 0.5) * top / BUCKETS


@dataclass(frozen=True)
class NoisyOracle:
    """Predicted buckets: the true bucket with the given top-1 accuracy, else a neighbour.

    Stands in for the trained predictors (their measured accuracy can be plugged in);
    `zero=True` gives the paper's zeroed-predictions ablation.
    """

    score_acc: float = 0.634
    length_acc: float = 0.730
    zero: bool = False

    def predict(self, task: Task, model: str, rng: random.Random) -> tuple[float, float]:
        if self.zero:
            return 0.0, 0.0
        sb, lb = bucket(task.scores[model], 1.0), bucket(task.lengths[model], MAX_TOKENS)
        if rng.random() > self.score_acc:
            sb = min(BUCKETS - 1, max(0, sb + rng.choice((-1, 1))))
        if rng.random() > self.length_acc:
            lb = min(BUCKETS - 1, max(0, lb + rng.choice((-2, -1, 1, 2))))
        return bucket_value(sb, 1.0), bucket_value(lb, MAX_TOKENS)


class ServedPredictor:
    """The predictions the gateway really makes: its own ONNX predictor run on the
    prompt (`policies.predictor.ScorePredictor`), not the truth with noise. One run per
    prompt covers every model; the result is kept."""

    def __init__(self, predictor: ScorePredictor) -> None:
        self.predictor = predictor
        self._index = dict(zip(predictor.models, range(len(predictor.models)), strict=True))
        self._cache: dict[str, dict[str, tuple[float, float]]] = {}

    def predict(self, task: Task, model: str, rng: random.Random) -> tuple[float, float]:
        found = self._cache.get(task.prompt)
        if found is None:
            preds = self.predictor.predict(task.prompt, list(self._index.values()))
            found = self._cache[task.prompt] = dict(zip(self._index, preds, strict=True))
        return found[model]


class Predictor(Protocol):
    """What the router is told of a request on a model: (score, length in tokens)."""

    def predict(self, task: Task, model: str, rng: random.Random) -> tuple[float, float]: ...


@dataclass(frozen=True)
class Arrival:
    """A request's arrival instant; from a trace, also its own prompt and output sizes,
    which then replace the prompt's (its text, scores and predictions stay); from a
    replayed stream (`bench qos-replay`), the prompt itself, else one is drawn."""

    t: float
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    task: Task | None = None


def poisson_arrivals(rate: float, rng: random.Random) -> Iterator[Arrival]:
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        yield Arrival(t)


def trace_arrivals(
    requests: Sequence[TraceRequest], rate: float | None = None, start: int = 0
) -> Iterator[Arrival]:
    """A trace's requests (any `TraceRequest` list: `workload.read_trace` reads the
    Azure CSV and the Mooncake JSONL) from the `start`-th, with their context and
    generated token counts; the instants optionally rescaled to a mean `rate` per
    second."""
    window = requests[start:]
    if not window:
        raise ValueError(f"the trace holds no request from the {start + 1}-th on")
    t0 = window[0].t
    span = window[-1].t - t0
    scale = (len(window) / span) / rate if rate and span > 0 else 1.0
    for r in window:
        yield Arrival((r.t - t0) * scale, r.input_len, r.output_len)


@dataclass(eq=False)
class Req:
    task: Task
    arrival: float
    prompt_tokens: int
    length: int  # the chosen expert's real output length
    score: float  # ... and real score
    pred_score: float
    pred_length: float
    generated: int = 0
    done_at: float = math.nan
    estimated: float = 0.0  # its progress as the gateway estimates it (see `Scraped`)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.generated

    def latency_per_token(self, now: float) -> float:
        return (now - self.arrival) / max(1, self.generated)

    def believe(self) -> None:
        """Take its predicted length and score for its real ones, as a world that knows
        only the predictions would (`EdgeEnv.fork`); one past its predicted length ends
        at its next token."""
        self.length = max(self.generated + 1, round(self.pred_length))
        self.score = self.pred_score


@dataclass(frozen=True)
class Scraped:
    """An engine's figures as of the gateway's last scrape of its metrics."""

    at: float = -math.inf
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    generated_total: int = 0


@functools.lru_cache(maxsize=4096)
def prompt_blocks(prompt: str, block_size: int) -> tuple[int, ...]:
    """A prompt's block hashes, as the emulated worker keys its prefix cache by them
    (the text of the user's message, `policies.text.block_hashes`)."""
    return block_hashes(prompt, block_size)


def _prefix_cache(spec: EdgeExpert) -> PrefixCache:
    """An expert's prefix cache: as many blocks as its KV memory holds, as the
    worker's engine keeps."""
    return PrefixCache(spec.memory_tokens // spec.block_size)


@dataclass(eq=False)
class ExpertState:
    spec: EdgeExpert
    running: list[Req] = field(default_factory=list)
    waiting: deque[Req] = field(default_factory=deque)
    fresh: list[Req] = field(default_factory=list)  # admitted, prefill in this iteration
    cache: PrefixCache | None = None  # its prefix cache, if the world has them
    prompt_total: int = 0  # prompt tokens admitted, ...
    skipped_total: int = 0  # ... and of those, skipped by the prefix cache
    clock: float = 0.0  # when the current iteration ends
    token_latency: float = 0.0  # of finished requests, as the gateway measures it
    generated_total: int = 0  # the engine's generation-token counter
    scraped: Scraped = field(default_factory=Scraped)

    @property
    def used_tokens(self) -> int:
        return sum(r.tokens for r in self.running)

    @property
    def in_flight(self) -> int:
        """Requests it holds: running (prefilling ones included) and waiting."""
        return len(self.running) + len(self.fresh) + len(self.waiting)

    def memory(self) -> float:
        return self.used_tokens / self.spec.memory_tokens

    def refuses(self) -> bool:
        """Its waiting queue is full: an arrival routed here is refused."""
        return len(self.waiting) >= self.spec.waiting_cap

    def figures(self, now: float) -> Scraped:
        """Its metrics as a scrape at `now` reads them."""
        return Scraped(
            now,
            len(self.running) + len(self.fresh),
            len(self.waiting),
            self.memory(),
            self.generated_total,
        )


RewardKind = Literal["qos", "completion"]
# Which running requests eq. 15 counts: those whose estimated latency with the new
# request reaches L (as written), or only those it pushes over (as the text says); or,
# instead of eq. 15, the QoS the decision really costs the expert's other requests
# ("counterfactual": its future with and without the new request if nothing more
# arrives, `timeline`), or that with the requests routed there while it ran
# ("hindsight": known only once they have finished); or that with each request's loss
# shared among the requests that each caused it ("shared", `EdgeEnv.hindsight_charges`).
Impact = Literal["reached", "pushed", "counterfactual", "hindsight", "shared"]
# The impacts known only in hindsight: the environment records what each expert was
# given, and the penalty is settled once the requests have finished.
HINDSIGHT: tuple[Impact, ...] = ("hindsight", "shared")


class Charges(NamedTuple):
    """What a routed request is charged for the others' loss, known in hindsight
    (`EdgeEnv.hindsight_charges`): each loss in full, or shared among its causes."""

    hindsight: float
    shared: float


def _changed_qos(changed: list[tuple[Req, int]], causes: Counter[Req] | None = None) -> float:
    """The QoS of the requests in `changed` (+1: lost, -1: gained), each divided among
    its `causes` if given."""
    if causes is None:
        return sum(r.score * d for r, d in changed)
    return sum(r.score * d / causes[r] for r, d in changed)


@dataclass(frozen=True)
class Queued:
    """An expert's requests at one moment and the jobs they are (`timeline.Job`, keyed
    by their index in `requests`): running, fresh (admitted, prefill in flight), waiting."""

    requests: list[Req]
    running: list[Job]
    fresh: list[Job]
    waiting: list[Job]
    clock: float  # when the iteration in flight ends
    now: float

    @classmethod
    def of(cls, e: ExpertState, now: float) -> Queued:
        reqs = [*e.running, *e.fresh, *e.waiting]
        jobs = [Job(i, r.prompt_tokens, r.generated, r.length) for i, r in enumerate(reqs)]
        a, b = len(e.running), len(e.running) + len(e.fresh)
        return cls(reqs, jobs[:a], jobs[a:b], jobs[b:], e.clock, now)


@dataclass(frozen=True)
class Option:
    """Where an arrival could go: expert n as it stood then, the request the arrival
    would be there, and how many requests n had been given by then (`EdgeEnv.given`;
    those after it came later)."""

    n: int
    found: Queued
    req: Req
    given: int


def _room(outcomes: list[tuple[float, float]]) -> float:
    """Over (others' loss, own QoS) per option: the best own QoS less loss, less the
    best of that among the options that give the arrival the most QoS of its own."""
    if not outcomes:
        return 0.0
    best = max(own for _, own in outcomes)
    return max(own - lost for lost, own in outcomes) - max(
        own - lost for lost, own in outcomes if own == best
    )


class EdgeEnv:
    """One decision per arrival: `step(action)` with 0 = drop, n = expert n."""

    def __init__(
        self,
        experts: list[EdgeExpert],
        tasks: list[Task],
        *,
        rate: float = 5.0,
        latency_req: float = 0.030,
        seed: int = 0,
        episode_len: int = 256,
        reward: RewardKind = "qos",
        predictor: Predictor | None = None,
        arrivals: Iterator[Arrival] | Sequence[Arrival] | None = None,
        impact: Impact = "reached",
        scrape: float | None = None,
        prefix_cache: bool = False,
        speed_prior: bool = False,
    ) -> None:
        """`scrape`: the router sees the experts as the gateway does, scraping the
        engines' metrics every `scrape` seconds (see `cluster_view`); None: their exact
        state at every decision. `arrivals`: an iterator (a trace) goes on from episode
        to episode; a sequence (a replayed stream) starts again at every reset; None:
        Poisson arrivals at `rate`. `prefix_cache`: each expert keeps the emulated
        engine's prefix cache (`policies.prefix_cache`), so a prompt it has seen skips
        the prefill of its cached blocks; the impact's futures (`timeline`) charge
        every prompt in full all the same. `speed_prior`: the router observes experts
        that have finished no request at the mean measured speed
        (`policies.qos_state.with_speed_prior`)."""
        if scrape is not None and not scrape > 0:
            raise ValueError(f"scrape must be > 0 s, not {scrape}")
        self.specs = experts
        self.scrape = scrape
        self.tasks = tasks
        self.rate = rate
        self.L = latency_req
        self.seed = seed
        self.episode_len = episode_len
        self.reward_kind = reward
        self.impact = impact
        self.predictor = predictor or NoisyOracle()
        self._arrivals_override = arrivals
        self.prefix_cache = prefix_cache
        self.speed_prior = speed_prior
        # requests have their predicted lengths and scores (`fork`, `Req.believe`)
        self.believed = False
        self.reset(seed)

    @property
    def n(self) -> int:
        return len(self.specs)

    def reset(
        self,
        seed: int | None = None,
        *,
        experts: list[EdgeExpert] | None = None,
        rate: float | None = None,
        latency_req: float | None = None,
        arrivals: Iterator[Arrival] | None = None,
    ) -> None:
        """A new episode; optionally on other hardware, load or latency target, or with
        `arrivals` of its own (this episode's only) instead of the environment's."""
        self.specs = experts or self.specs
        self.rate = rate or self.rate
        self.L = latency_req or self.L
        self.rng = random.Random(self.seed if seed is None else seed)
        self.experts = [
            ExpertState(s, cache=_prefix_cache(s) if self.prefix_cache else None)
            for s in self.specs
        ]
        self.last_request: Req | None = None  # what the last `step` routed, and ...
        self.last_penalty = 0.0  # ... the impact penalty it incurred
        # impact "hindsight": each routed request's expert, its place in the requests
        # that expert was given, and the expert as it found it
        self.found: dict[Req, tuple[int, int, Queued]] = {}
        self.given: list[list[Req]] = [[] for _ in self.specs]
        given = self._arrivals_override if arrivals is None else arrivals
        self.arrivals = (
            iter(given)
            if isinstance(given, Sequence)
            else given or poisson_arrivals(self.rate, self.rng)
        )
        self.now = 0.0
        self.counted = Arrivals()  # the arrivals as the gateway counts them, for their rate
        self._next_scrape = 0.0
        self.decisions = 0
        self.finished: list[Req] = []  # completed requests, with their QoS
        self.dropped = 0
        self._completed_qos = 0.0
        self._next_request()

    # -- requests -----------------------------------------------------------------

    def _next_request(self) -> None:
        try:
            arrival = next(self.arrivals)
        except StopIteration:
            raise ValueError(
                f"the arrivals ran out at decision {self.decisions} of the episode's "
                f"{self.episode_len} (each decision waits for the arrival after it)"
            ) from None
        self._advance(arrival.t)
        self.counted = self.counted.arrived(arrival.t)
        task = arrival.task or self.rng.choice(self.tasks)
        if arrival.prompt_tokens is not None and arrival.output_tokens is not None:
            # The trace's sizes, capped as the prompts are (every expert can hold it).
            out = min(MAX_TOKENS, max(1, arrival.output_tokens))
            task = replace(
                task,
                prompt_tokens=min(MAX_PROMPT_TOKENS, max(1, arrival.prompt_tokens)),
                lengths=dict.fromkeys(task.lengths, out),
            )
        self.task = task
        self.preds = [self.predictor.predict(self.task, e.model, self.rng) for e in self.specs]

    def qos(self, r: Req) -> float:
        return r.score * (r.latency_per_token(r.done_at) <= self.L)

    # -- the experts' iterations ----------------------------------------------------

    def _advance(self, t: float) -> None:
        """Run every expert's iterations that end by time t, and the gateway's scrapes
        of their metrics due by then."""
        if self.scrape is not None:
            while self._next_scrape <= t:
                self._run_until(self._next_scrape)
                for e in self.experts:
                    self._scrape(e)
                self._next_scrape += self.scrape
        self._run_until(t)

    def _scrape(self, e: ExpertState) -> None:
        """What the gateway's monitor does with a scrape: keep the counts and memory, and
        share the tokens generated since the last one among the requests it has in flight
        there (`policies.qos_state.progress_share`)."""
        seen = e.figures(self.now)
        inflight = [*e.running, *e.fresh, *e.waiting]
        share = progress_share(
            seen.generated_total - e.scraped.generated_total, seen.running, len(inflight)
        )
        for r in inflight:
            r.estimated += share
        e.scraped = seen

    def _run_until(self, t: float) -> None:
        for e in self.experts:
            while True:
                if not e.running and not e.fresh:
                    self._admit(e, max(e.clock, self.now))
                    if not e.fresh:
                        break
                if e.clock > t:
                    break
                self._finish_iteration(e)
        self.now = t

    def _admit(self, e: ExpertState, start: float) -> None:
        """At an iteration boundary (nothing fresh yet): admit waiting requests whose KV
        fits, then start the next iteration, charging their prefill less what their
        expert's prefix cache holds of it."""
        prefill = 0
        while e.waiting and fits(
            e.spec,
            len(e.running) + len(e.fresh),
            e.used_tokens + sum(r.tokens for r in e.fresh),
            e.waiting[0].tokens,
        ):
            r = e.waiting.popleft()
            e.fresh.append(r)
            prefill += r.prompt_tokens
            e.prompt_total += r.prompt_tokens
            if e.cache is not None:
                blocks = prompt_blocks(r.task.prompt, e.spec.block_size)
                cached = skipped(e.cache.hit(blocks) * e.spec.block_size, r.prompt_tokens)
                prefill -= cached
                e.skipped_total += cached
                e.cache.remember(blocks)
        if not e.running and not e.fresh:
            return
        decode = sum(r.tokens for r in e.running)
        e.clock = iteration_end(e.spec, start, prefill, decode)

    def _finish_iteration(self, e: ExpertState) -> None:
        end = e.clock
        e.running.extend(e.fresh)
        e.fresh = []
        e.generated_total += len(e.running)
        still = []
        for r in e.running:
            r.generated += 1
            if r.generated >= r.length:
                r.done_at = end
                e.token_latency = token_latency_mix(e.token_latency, r.latency_per_token(end))
                q = self.qos(r)
                self._completed_qos += q
                self.finished.append(r)
            else:
                still.append(r)
        e.running = still
        self._admit(e, end)
        if not e.running and not e.fresh:
            e.clock = end

    # -- the router's step ------------------------------------------------------------

    def request_for(self, n: int) -> Req:
        """The waiting arrival as a request on expert n: that model's real answer length
        and score, and the predictions the router was given for it."""
        model = self.experts[n].spec.model
        req = Req(
            self.task,
            self.now,
            self.task.prompt_tokens,
            self.task.lengths[model],
            self.task.scores[model],
            self.preds[n][0],
            self.preds[n][1],
        )
        if self.believed:
            req.believe()
        return req

    def impact_penalty(self, n: int, req: Req) -> float:
        """What routing `req` (the current arrival) to expert n costs the requests there:
        eq. 15's estimate, or with impact "counterfactual" the true cost if nothing
        more arrives; with "hindsight" or "shared" 0 here, known later
        (`hindsight_charges`)."""
        if self.impact in HINDSIGHT:
            self.found[req] = (n, len(self.given[n]), Queued.of(self.experts[n], self.now))
            self.given[n].append(req)
            return 0.0
        if self.impact == "counterfactual":
            return self.counterfactual_impact(n, req)
        return self.estimated_impact(n, pushed=self.impact == "pushed")

    def counterfactual_impact(self, n: int, req: Req) -> float:
        """The QoS (eq. 1, true scores and lengths) that expert n's other requests lose
        when `req` joins its queue, by the expert's future with and without it if nothing
        more arrives (`timeline.finish_times`): what eq. 15 estimates, known exactly
        here because the simulator knows every request's length. Training only."""
        return self._lost(Queued.of(self.experts[n], self.now), n, req, [])

    def hindsight_impact(self, req: Req) -> float:
        """The QoS that expert n's other requests lost because `req` (routed there
        earlier, an impact in `HINDSIGHT`) ran beside them: those there when it arrived and
        those routed there before it finished, by the expert's future with and without
        it, the latter arrivals included. Known once `req` has finished; the arrivals
        after it are left out of both futures (its backlog's later effects are not
        counted). Training only."""
        return _changed_qos(self._hindsight_changes(req))

    def hindsight_charges(self) -> dict[Req, Charges]:
        """Every routed request's `hindsight_impact`, and that with each loss shared: a
        request whose QoS several requests each changed (each one's absence alone would
        have let it meet L) is charged to them in equal parts. The plain hindsight
        impact charges such a loss once to every request that caused it, so its charges
        add up to several times the QoS the requests lost to one another when many sit
        near L (docs/research.md, "The impact shared"); the shared ones add up to the
        part of that loss that some single request could have prevented. Both from one
        run of each request's futures. Read once every routed request has finished.
        Training only."""
        if self.impact not in HINDSIGHT:
            raise ValueError("hindsight charges need what a hindsight impact records")
        changes = {req: self._hindsight_changes(req) for req in self.found}
        causes = Counter(r for changed in changes.values() for r, _ in changed)
        return {
            req: Charges(_changed_qos(changed), _changed_qos(changed, causes))
            for req, changed in changes.items()
        }

    def _hindsight_changes(self, req: Req) -> list[tuple[Req, int]]:
        """The requests whose meeting L `req` changed, in hindsight (as
        `hindsight_impact` counts them), each with +1 (it missed L because of `req`) or
        -1 (it met L because of it)."""
        if not math.isfinite(req.done_at):
            raise ValueError("a request's hindsight impact is known once it has finished")
        n, place, found = self.found[req]
        later = [r for r in self.given[n][place + 1 :] if r.arrival < req.done_at]
        return self._changes(found, n, req, later)[0]

    def options(self) -> list[Option]:
        """Where the current arrival could go: every expert that would take it, as it
        stands now."""
        return [
            Option(n, Queued.of(e, self.now), self.request_for(n), len(self.given[n]))
            for n, e in enumerate(self.experts)
            if not e.refuses()
        ]

    def impact_room(self, options: list[Option]) -> float:
        """What weighing the others' loss can change in routing the current arrival:
        over its `options` (`options()`, taken now), the best of its own QoS less what
        the others there lose, less the best of that among the experts that give it the
        most QoS of its own; each expert's future with and without it, nothing more
        arriving (as `counterfactual_impact`). 0 when the two choices agree. Training
        and benchmarks only."""
        outcomes = [self._joined(o.found, o.n, o.req, [])[:2] for o in options]
        return _room(outcomes)

    def hindsight_room(self, options: list[Option], routed: Req | None) -> float:
        """`impact_room` counted in hindsight, as `hindsight_impact` counts the impact:
        at each of an arrival's `options` (taken when it arrived; `routed`: the request
        it became, if it was routed), the requests this episode went on to route to that
        expert before the arrival would have finished there join both futures. The
        episode's later routing is held as it was, as if it did not depend on where the
        arrival went. Read once the episode has ended (an impact in `HINDSIGHT` keeps
        what each expert was given)."""
        if self.impact not in HINDSIGHT:
            raise ValueError("the hindsight room needs what a hindsight impact records")
        outcomes = []
        for o in options:
            after = [r for r in self.given[o.n][o.given :] if r is not routed]
            later: list[Req] = []
            while True:  # the arrival's finish there, with those that came before it
                lost, own, done = self._joined(o.found, o.n, o.req, later)
                wider = [r for r in after if r.arrival < done]
                if len(wider) <= len(later):
                    break
                later = wider
            outcomes.append((lost, own))
        return _room(outcomes)

    def _lost(self, found: Queued, n: int, req: Req, later: list[Req]) -> float:
        """What the requests in `found` and `later` (arriving at their times) lose to
        `req` joining expert n's queue at `found.now`."""
        return self._joined(found, n, req, later)[0]

    def _joined(
        self, found: Queued, n: int, req: Req, later: list[Req]
    ) -> tuple[float, float, float]:
        """`_lost`, the QoS `req` itself gets there, and when it finishes there."""
        changed, own, done = self._changes(found, n, req, later)
        return _changed_qos(changed), own, done

    def _changes(
        self, found: Queued, n: int, req: Req, later: list[Req]
    ) -> tuple[list[tuple[Req, int]], float, float]:
        """The requests in `found` and `later` whose meeting L `req` joining expert n's
        queue at `found.now` changes (+1: they miss it because of `req`, -1: they meet
        it because of it), the QoS `req` itself gets there, and when it finishes."""
        others = [*found.requests, *later]
        first = len(found.requests)
        arrivals = [
            (r.arrival, Job(first + i, r.prompt_tokens, 0, r.length)) for i, r in enumerate(later)
        ]
        new = Job(len(others), req.prompt_tokens, 0, req.length)
        spec, f = self.experts[n].spec, found
        without = finish_times(spec, f.running, f.fresh, f.waiting, f.clock, f.now, arrivals)
        with_new = finish_times(
            spec, f.running, f.fresh, [*f.waiting, new], f.clock, f.now, arrivals
        )

        def met(r: Req, done: float) -> bool:
            return (done - r.arrival) / r.length <= self.L

        changed = [
            (r, d)
            for i, r in enumerate(others)
            if (d := int(met(r, without[i])) - int(met(r, with_new[i])))
        ]
        done = with_new[new.key]
        return changed, req.score * met(req, done), done

    def estimated_impact(self, n: int, pushed: bool = False) -> float:
        """Eq. 13-15: predicted QoS of running requests on expert n whose estimated
        latency with the current request reaches L (as written); `pushed`: only those
        below L without it."""
        e = self.experts[n]
        pred_len = max(1.0, self.preds[n][1])
        p_j = self.task.prompt_tokens
        batch = e.running + e.fresh  # fresh: in the batch, prefill in flight
        step = e.spec.base + e.spec.k2 * sum(r.tokens for r in batch)  # an iteration now
        penalty = 0.0
        for r in batch:
            d_i = max(float(r.generated + 1), r.pred_length)
            m = max(0.0, min(d_i - r.generated, pred_len))
            extra = (e.spec.k1 * p_j + e.spec.k2 * (m * p_j + m * (m + 1) / 2)) / d_i
            # l_hat: the *final* average latency per token projected at today's pace (the
            # quantity eq. 15's increase is measured against), not the current average,
            # which early in decode is dominated by the time to the first token.
            projected = ((self.now - r.arrival) + (d_i - r.generated) * step) / d_i
            if projected + extra >= self.L and (not pushed or projected < self.L):
                penalty += r.pred_score
        return penalty

    def step(self, action: int) -> tuple[float, bool]:
        """Route the waiting arrival; returns (reward, episode done). The request it
        routed (None when dropped) and the action impact penalty are kept as
        `last_request` and `last_penalty`, for credit given per request."""
        penalty = 0.0
        self.last_request = None
        if action == 0:
            self.dropped += 1
            self.finished.append(
                Req(
                    self.task, self.now, self.task.prompt_tokens, 1, 0.0, 0.0, 0.0, done_at=math.inf
                )
            )
        else:
            n = action - 1
            e = self.experts[n]
            if e.refuses():
                self.dropped += 1  # the expert refuses: as good as dropped
                self.finished.append(
                    Req(
                        self.task,
                        self.now,
                        self.task.prompt_tokens,
                        1,
                        0.0,
                        0.0,
                        0.0,
                        done_at=math.inf,
                    )
                )
            else:
                req = self.request_for(n)
                if self.reward_kind == "qos":
                    penalty = self.impact_penalty(n, req)
                e.waiting.append(req)
                self.last_request = req
                if not e.running and not e.fresh:
                    self._admit(e, self.now)
        self.last_penalty = penalty
        self.decisions += 1
        self._completed_qos = 0.0
        self._next_request()
        reward = self._completed_qos - penalty
        return reward, self.decisions >= self.episode_len

    def fork(self, seed: int, believed: bool = False) -> EdgeEnv:
        """A copy of this episode as it stands, the waiting arrival included, whose
        later arrivals are drawn afresh from `seed` (Poisson at its rate, prompts from
        its tasks): what looking ahead may assume (`edgeroute.qos.rollout`), where the
        episode's own future would be the truth. `believed`: in the copy every request,
        in flight or to come, has its predicted length and score rather than its
        model's real ones (a request past its predicted length ends at its next token),
        so that the copy knows of the requests only what a router does. The copy keeps
        no finished requests and is rewarded by completions, so it carries none of the
        impact's bookkeeping; it shares the tasks, the predictor and the experts'
        specs."""
        if self._arrivals_override is not None:
            raise ValueError("only an episode of Poisson arrivals can be forked")
        shared = (self.tasks, self.predictor, self.specs, *self.tasks, *self.specs)
        memo: dict[int, Any] = {id(x): x for x in shared}
        memo |= {id(self.arrivals): None, id(self.finished): [], id(self.found): {}}
        memo[id(self.given)] = [[] for _ in self.specs]
        twin = copy.deepcopy(self, memo)
        twin.rng = random.Random(seed)
        now = self.now
        twin.arrivals = (Arrival(now + a.t) for a in poisson_arrivals(self.rate, twin.rng))
        twin.reward_kind = "completion"
        if believed:
            twin.believed = True
            for e in twin.experts:
                for r in (*e.running, *e.fresh, *e.waiting):
                    r.believe()
        return twin

    def drain(self) -> None:
        """Run until every routed request has finished (for evaluation)."""
        while any(e.running or e.fresh or e.waiting for e in self.experts):
            t = min(e.clock for e in self.experts if e.running or e.fresh or e.waiting)
            self._advance(t + 1e-9)

    # -- what the router observes ---------------------------------------------------------

    def observe(self) -> dict[str, np.ndarray]:
        """Dense, padded features (eq. 6, 7, 9-12) and masks; see `policies.qos_state`."""
        return observe(self)


# -- the state as the gateway sees it, and the router's features of it ------------

MODEL = "edge"  # every simulated expert serves it, under its own model as `expert`


def cluster_view(env: EdgeEnv, i: int) -> tuple[RequestInfo, ClusterView]:
    """The waiting arrival (the `i`th decision) and the experts as the gateway would
    see them: the engine's running and waiting counts, KV use and capacity, and the
    in-flight requests with their predictions and progress. With `env.scrape` set, the
    counts and memory are the last scrape's and a request's progress is the gateway's
    estimate (its answer is not streamed); else all of it is exact."""
    backends = []
    for n, e in enumerate(env.experts):
        queue = [*e.running, *e.fresh, *e.waiting]
        seen = e.figures(env.now) if env.scrape is None else e.scraped
        backends.append(
            BackendView(
                id=f"e{n}",
                models=frozenset({MODEL}),
                expert=e.spec.model,
                running=seen.running,
                waiting=seen.waiting,
                kv_usage=seen.kv_usage,
                kv_capacity_tokens=e.spec.memory_tokens,
                stats_age=env.now - seen.at,
                inflight=len(queue),
                max_batch=e.spec.running_cap,
                token_latency=e.token_latency,
                requests=tuple(
                    InflightRequest(
                        r.prompt_tokens,
                        r.arrival,
                        r.generated if env.scrape is None else int(r.estimated),
                        r.pred_score,
                        r.pred_length,
                    )
                    for r in queue
                ),
            )
        )
    req = RequestInfo(
        model=MODEL,
        prompt_tokens=env.task.prompt_tokens,
        prompt=env.task.prompt,
        seq=i,
        entropy=(env.seed * 1_000_003 + i) * 0x9E3779B97F4A7C15 % 2**64,  # not env.rng
        now=env.now,
        arrival_rate=env.counted.rate(),
    )
    return req, ClusterView(tuple(backends))


def observe(env: EdgeEnv, n_max: int | None = None) -> dict[str, np.ndarray]:
    """The features the gateway's `qos_drl` would build from `cluster_view`."""
    req, view = cluster_view(env, env.decisions)
    experts = [snapshot(b, view.stale_after) for b in view.backends]
    if env.speed_prior:
        experts = list(with_speed_prior(experts))
    return encode(req.prompt_tokens, env.preds, experts, env.L, env.now, n_max, req.arrival_rate)
