"""The QoS router's training settings: the SAC learner's and the run's (no torch here,
so the command line can show the defaults without loading it)."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from edgeroute.sim.edge import HINDSIGHT, TRAIN_HARDWARE, Fleet, Quality, check_range
from policies.predictor import MODEL_ROOT

# The quality data a QoS router is trained and measured on (`edgeroute.sim.edge.Quality`):
# RouterBench's first, the default everywhere.
QUALITIES = ("routerbench", "routerdc")
# What each one's prompts are, for results and model cards.
QUALITY_PROMPTS = {
    "routerbench": "MBPP prompts of RouterBench, scored 0/1",
    "routerdc": "RouterDC free-form prompts (GSM8K, MBPP, HumanEval, JavaScript, MATH), "
    "scored as the share of 10 sampled answers that were right",
}


# How a predictor's graph reads its bucket distributions out: the most likely bucket
# (the paper's classifier read), or the expected bucket rounded to the nearest one,
# which keeps how sure the classifier is (a 50/50 split of buckets 0 and 9 reads 4, not 0).
Read = Literal["argmax", "expected"]
READS: tuple[Read, ...] = get_args(Read)


def quality_dir(quality: str) -> Path:
    """A quality world's folder: its predictor, its runs/ and its model card (RouterBench's
    is models/qos itself)."""
    return MODEL_ROOT if quality == QUALITIES[0] else MODEL_ROOT / quality


def best_predicted(quality: str, predictor: Path | None = None) -> dict[str, Any]:
    """The routing spec of BR (the QoS papers' BERT-router baseline) in `quality`'s
    world: the gateway's `best_predicted` preset with that world's predictor, or the
    one in folder `predictor`. The simulator and the live run both route by it."""
    model = str(predictor or quality_dir(quality))
    return {
        "policy": "best_predicted",
        "scorers": [{"type": "predicted_quality", "params": {"model": model}}],
    }


# How a benchmark serves an agent beyond qos_drl's defaults, by the agent's name: its
# parameters `shed` and `sample` (`edgeroute bench qos`'s --no-shed and --sample).
Serving = dict[str, dict[str, bool]]


def quality_suffix(quality: str) -> str:
    """What a results file's name takes for `quality`: nothing for the default."""
    return "" if quality == QUALITIES[0] else f"_{quality}"


def quality_flag(quality: str) -> str:
    """The command-line option that selects `quality`, as a command's record shows it."""
    return "" if quality == QUALITIES[0] else f" --quality {quality}"


@dataclass(frozen=True)
class SACConfig:
    encoder: str = "han"  # or "experts" for Baseline RL
    hidden: int = 32
    heads: int = 2
    layers: int = 1
    gamma: float = 0.99
    tau: float = 0.005
    lr: float = 3e-4
    batch: int = 256
    buffer: int = 50_000
    target_entropy_ratio: float = 0.5  # of log(number of actions)
    init_alpha: float = 0.05  # rewards are QoS in [0, 1]: alpha = 1 would drown them
    drop: bool = True  # False: the actor never drops (`PointerHead.forbid_drop`)
    load: bool = False  # True: the encoders read the load (`edgeroute.qos.model`)
    critic_load: bool = False  # True: the critic's heads read it (`TwinCritic`)


DEFAULT_RATE, DEFAULT_LATENCY_MS = 5.0, 30.0  # the paper's default setting
RATES = (3.0, 8.0)  # the paper's sweep of lambda, per second
LATENCIES_MS = (20.0, 40.0)  # ... and of L
# The points of those sweeps besides the default (lambda=5, L=30 ms), as the benchmark
# measures them.
SWEEP_RATES = (3.0, 4.0, 6.0, 8.0)
SWEEP_LATENCIES_MS = (20.0, 25.0, 40.0)
SWEEP_EXPERTS = (3, 9, 12)  # ... and of N, whose default is 6


@dataclass(frozen=True)
class Point:
    """One setting of the paper's sweep: experts, arrival rate (per s), target (ms)."""

    label: str
    n: int = 6
    rate: float = DEFAULT_RATE
    latency_ms: float = DEFAULT_LATENCY_MS


# The default and every point of the paper's sweeps (N, lambda, L), in the order the
# benchmark reports them.
SWEEP_POINTS: tuple[Point, ...] = (
    Point("default"),
    *(Point(f"N={n}", n=n) for n in SWEEP_EXPERTS),
    *(Point(f"lambda={r:g}", rate=r) for r in SWEEP_RATES),
    *(Point(f"L={lat:g}ms", latency_ms=lat) for lat in SWEEP_LATENCIES_MS),
)
KEEP = ("best", "last")  # the actor a training run exports (`TrainConfig.keep`)


def rate_range(config: dict[str, Any]) -> str:
    """How a training config drew each episode's lambda: "[3, 8]/s". Configs from
    before the range was a setting drew from `RATES`."""
    low, high = config.get("rates", RATES)
    return f"[{low:g}, {high:g}]/s"


def latency_range(config: dict[str, Any]) -> str:
    """How a training config drew each episode's L: "[20, 40] ms", or relative to the
    fleet's fastest expert. Configs from before the range was a setting drew from
    `LATENCIES_MS`."""
    factors = config.get("latency_over_fastest")
    if factors:
        low, high = factors
        return f"[{low:g}, {high:g}] times the fastest expert's ms per iteration"
    low, high = config.get("latencies_ms", LATENCIES_MS)
    return f"[{low:g}, {high:g}] ms"


def current_shape(config: dict[str, Any]) -> dict[str, Any]:
    """A recorded training config (a record's or a checkpoint's) in today's shape:
    configs from before the fleet was one setting hold its fields flat; those from
    before the drop action was optional had it; those from before the replay's size
    was a setting kept SACConfig's; those from before the kept actor was a setting
    kept the best."""
    config = {"drop": True, "buffer": SACConfig.buffer, "keep": "best", **config}
    if "fleet" in config:
        return config
    flat = {f.name for f in fields(Fleet)}
    rest = {k: v for k, v in config.items() if k not in flat}
    return {**rest, "fleet": asdict(Fleet.from_record(config))}


RECORD = "training.json"  # a training run's record, in the run's folder beside its actor


def read_record(run: Path) -> dict[str, Any]:
    """A training run's record (`RECORD` in the folder `run`)."""
    data: dict[str, Any] = json.loads((run / RECORD).read_text())
    return data


def write_record(run: Path, record: dict[str, Any]) -> None:
    (run / RECORD).write_text(json.dumps(record, indent=1) + "\n")


def recorded_runs(folder: Path) -> list[Path]:
    """The runs in `folder` that have a record, by name."""
    return sorted(p.parent for p in folder.glob(f"*/{RECORD}"))


def _record_config(run: Path) -> dict[str, Any]:
    config: dict[str, Any] = read_record(run).get("config", {}) if (run / RECORD).exists() else {}
    return config


def trained_latencies(run: Path) -> str:
    """`latency_range` of a training run, as its record says."""
    return latency_range(_record_config(run))


def trained_rates(run: Path) -> str:
    """`rate_range` of a training run, as its record says."""
    return rate_range(_record_config(run))


def trained_fleet(run: Path) -> Fleet:
    """The fleet a training run's experts were drawn from, as its record says."""
    return Fleet.from_record(_record_config(run))


# `TrainConfig`'s settings whose option is not their name with dashes, and those the
# command line does not set (`threads`: training runs on one).
_OPTIONS = {"latencies_ms": "latencies", "target_entropy_ratio": "target-entropy"}
_NO_OPTION = frozenset({"threads"})


@dataclass(frozen=True)
class TrainConfig:
    variant: str = "full"
    quality: Quality = "routerbench"
    experts: int = 6
    # Or, when set, each episode's N is drawn in this range (inclusive), observations
    # padded to its top: one agent for small fleets and large ones. Tried at 3-12 alone
    # (one seed): level with six-expert training at 9 and 12, below it at 3 and 6
    # (docs/research.md, (234)).
    experts_range: tuple[int, int] | None = None
    rate: float = DEFAULT_RATE
    latency_ms: float = DEFAULT_LATENCY_MS
    # "request": each decision is credited with the QoS of the request it routed (and
    # the impact penalty); "completion": the paper's letter, completions rewarded at the
    # decision during which they finish (see docs/research.md for what each measured).
    credit: str = "request"
    # eq. 15 as written, "pushed": only requests it pushes over L, "counterfactual": the
    # QoS the decision truly costs the others if nothing more arrives
    # (`EdgeEnv.counterfactual_impact`), "hindsight": with the requests that arrived
    # while its request ran (`EdgeEnv.hindsight_impact`), or "shared": that with each
    # loss shared among the requests that caused it (`EdgeEnv.hindsight_charges`)
    impact: str = "reached"
    # The weight of the impact penalty in a decision's reward (eq. 16 weighs it 1): a
    # departure from the paper's letter, tried to give the impact more say beside the
    # routed request's own QoS (docs/research.md, (178)).
    impact_scale: float = 1.0
    # When set, the weight is also scaled by each episode's lambda: by the first at the
    # bottom of `rates`, the second at the top, linear between. A single weight trades
    # one load against another ((178), (236)); this one asks for care where engines are
    # scarce and for the best engine where they are not. At 0.5,1.5 it lost at light
    # load and kept the uniform weight's gain at N = 12 only (docs/research.md, (237)).
    impact_scale_by_rate: tuple[float, float] | None = None
    randomise: bool = True  # each episode draws lambda in `rates` and L in `latencies_ms`
    # The range lambda (requests per second) is drawn from: the paper's sweep by default.
    # A wider one puts the sweep's heaviest load inside what training sees rather than
    # at its edge (see docs/research.md, (131)).
    rates: tuple[float, float] = RATES
    # The range L is drawn from: the paper's sweep by default. A wider one reaches below
    # it, where some experts' hardware cannot meet L at all (see docs/research.md).
    latencies_ms: tuple[float, float] = LATENCIES_MS
    # Or, when set, L is the episode's fastest expert's base ms per iteration times a
    # factor drawn in this range: every episode's target is one the fleet can meet, and
    # one that only its fastest expert can meet comes often (see docs/research.md).
    latency_over_fastest: tuple[float, float] | None = None
    # How training experts are drawn: base ms per iteration (a wider range than the
    # benchmark's 10-22 ms reaches the live engines', `workers/profiles.py`: 20-40 ms),
    # batch cap, KV memory and waiting room (the paper's 5, 2-6K tokens and 5; large
    # ones make the live engines' regime, where every added request slows a big batch).
    # `edgeroute bench qos` takes the same fleet to measure agents in their world.
    fleet: Fleet = Fleet()
    # The agent sees the experts as the gateway does, from scrapes of the engines'
    # metrics this many ms apart (counts, memory, estimated progress; see
    # `edgeroute.sim.edge.cluster_view`); None: their exact state at every decision.
    scrape_ms: float | None = None
    # False: no drop action, for engines that queue rather than refuse (the agent is
    # served as with `shed: false`, and trained for it).
    drop: bool = True
    # True: the agent reads an expert that has finished no request at the mean measured
    # seconds per token (`policies.qos_state.with_speed_prior`), as it is then served.
    speed_prior: bool = False
    # True: the agent reads the load, the requests arriving per second per expert
    # (`policies.qos_state.load_feature`), as the gateway measures it; see
    # docs/research.md, (136).
    arrival_rate: bool = False
    # True: the critic's heads read the load; without `arrival_rate` the actor's state
    # stays as without it (an asymmetric actor-critic; see docs/research.md, (142)).
    critic_arrival_rate: bool = False
    # The share of training episodes whose first decisions all go to one expert drawn
    # at random (`edgeroute.qos.train.herded_start`); see docs/research.md, (145).
    herded_starts: float = 0.0
    # A trace (any format `edgeroute.sim.workload.read_trace` reads) whose windows give
    # this share of the training episodes their arrivals, with the trace's token counts,
    # at the episode's lambda ("": none); see docs/research.md, (208).
    trace: str = ""
    trace_share: float = 0.0
    steps: int = 150_000
    warmup: int = 5_000
    envs: int = 16
    update_every: int = 16  # environment steps per SAC update
    batch: int = 256
    # Transitions the replay keeps, the newest replacing the oldest (the whole run at
    # `steps`).
    buffer: int = SACConfig.buffer
    eval_every: int = 10_000
    eval_episodes: int = 4
    # Checkpoints are chosen on `eval_episodes` episodes of the default setting, or
    # ("sweep") one episode at each point of the paper's sweep (training data alike).
    select_on: str = "default"
    # The actor a run exports: "best", its best evaluation's; or "last", the final
    # step's, chosen without looking at any evaluation (the best of many noisy
    # evaluations favours a lucky checkpoint; see docs/research.md, (45)).
    keep: str = "best"
    episode_len: int = 256
    seed: int = 0
    zero_predictions: bool = False
    # The folder of the predictor whose outputs the agent reads ("": the quality world's);
    # the run's folder must be under it, so that it is served with the same one
    # (`policies.predictor.predictor_dir`).
    predictor: str = ""
    threads: int = 1
    lr: float = 3e-4
    # The discount: each decision is already credited with its own request's QoS, so
    # the return's tail is other requests'; a lower one shrinks the critic's values
    # (about QoS / (1 - gamma)) beside the gap between actions (docs/research.md, (214)).
    gamma: float = SACConfig.gamma
    target_entropy_ratio: float = 0.5
    init_alpha: float = 0.05
    hidden: int = 32
    heads: int = 2
    layers: int = 1

    def __post_init__(self) -> None:
        if self.episode_len < 1:
            raise ValueError(f"an episode is at least one decision, not {self.episode_len}")
        if self.eval_episodes < 1:
            raise ValueError(f"an evaluation is at least one episode, not {self.eval_episodes}")
        if self.buffer < 1:
            raise ValueError(f"the replay keeps at least one transition, not {self.buffer}")
        if self.keep not in KEEP:
            raise ValueError(f"a run keeps its {' or '.join(KEEP)} actor, not {self.keep!r}")
        if not 0.0 <= self.herded_starts <= 1.0:
            raise ValueError(f"herded starts are a share of episodes, not {self.herded_starts}")
        if not 0.0 <= self.trace_share <= 1.0:
            raise ValueError(f"trace episodes are a share of episodes, not {self.trace_share}")
        if self.trace_share and not self.trace:
            raise ValueError("a share of trace episodes needs a trace to read them from")
        check_range(self.rates, "lambda per second")
        if self.experts_range is not None:
            low, high = self.experts_range
            if not 1 <= low <= high or low != int(low) or high != int(high):
                raise ValueError(f"expected N from 1, low then high, not {low},{high}")
        check_range(self.latencies_ms, "L in ms")
        if self.latency_over_fastest is not None:
            check_range(self.latency_over_fastest, "L's factor over the fastest expert")
        if not 0.0 <= self.gamma < 1.0:
            raise ValueError(f"the discount is in [0, 1), not {self.gamma}")
        if self.impact_scale < 0:
            raise ValueError(f"the impact penalty's weight is at least 0, not {self.impact_scale}")
        if self.impact_scale_by_rate is not None:
            check_range(self.impact_scale_by_rate, "the impact penalty's factors by lambda")
        if self.impact in HINDSIGHT and self.credit != "request":
            # completions credited as they happen would carry no penalty at all
            raise ValueError(f"the {self.impact} impact is credited per request (credit 'request')")

    @classmethod
    def from_record(cls, config: dict[str, Any]) -> TrainConfig:
        """The config a record (or a checkpoint) holds, in any of its past shapes."""
        config = current_shape(config)
        tuples = {k: tuple(v) for k, v in config.items() if isinstance(v, list)}
        return cls(**{**config, **tuples, "fleet": Fleet.from_record(config)})

    def flags(self, leave_out: Collection[str] = ()) -> str:
        """The `edgeroute train qos` options that give this config: those of every
        setting not at its default and not in `leave_out` (the fleet's as `Fleet.flags`
        has them)."""
        default, out = TrainConfig(), []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == getattr(default, f.name) or f.name in {*_NO_OPTION, *leave_out}:
                continue
            option = _OPTIONS.get(f.name, f.name.replace("_", "-"))
            if f.name == "fleet":
                out.append(value.flags())
            elif isinstance(value, bool):
                out.append(f" --{'' if value else 'no-'}{option}")
            elif isinstance(value, tuple):
                out.append(f" --{option} {value[0]:g},{value[1]:g}")
            else:
                out.append(
                    f" --{option} {value:g}" if isinstance(value, float) else f" --{option} {value}"
                )
        return "".join(out)

    @property
    def most_experts(self) -> int:
        """The largest fleet an episode may draw: what observations are padded to."""
        return self.experts if self.experts_range is None else self.experts_range[1]

    def impact_weight(self, rate: float) -> float:
        """The impact penalty's weight in an episode of `rate` requests per second."""
        if self.impact_scale_by_rate is None:
            return self.impact_scale
        light, heavy = self.impact_scale_by_rate
        low, high = self.rates
        share = (rate - low) / (high - low) if high > low else 0.0
        return self.impact_scale * (light + (heavy - light) * min(max(share, 0.0), 1.0))

    @property
    def reward(self) -> str:
        return "qos" if self.variant == "full" else "completion"

    def sac(self) -> SACConfig:
        return SACConfig(
            encoder="experts" if self.variant == "baseline" else "han",
            hidden=self.hidden,
            heads=self.heads,
            layers=self.layers,
            lr=self.lr,
            gamma=self.gamma,
            batch=self.batch,
            buffer=self.buffer,
            target_entropy_ratio=self.target_entropy_ratio,
            init_alpha=self.init_alpha,
            drop=self.drop,
            load=self.arrival_rate,
            critic_load=self.critic_arrival_rate,
        )


@dataclass(frozen=True)
class SelectConfig:
    """`edgeroute train qos-select`'s settings (`edgeroute.qos.select`)."""

    episodes: int = 8  # per point, each on its own training hardware
    keep: int = 3
    # Training hardware seeds from here on: inside TRAIN_HARDWARE, past the ones
    # `train.eval_score` chose checkpoints on (1, 2, ...).
    first_hardware: int = 5001
    seed: int = 0  # the episodes' arrivals and prompts
    episode_len: int = 512

    def __post_init__(self) -> None:
        last = self.first_hardware + self.episodes - 1
        if self.first_hardware < 100 or last not in TRAIN_HARDWARE:
            raise ValueError(
                f"hardware seeds {self.first_hardware}-{last} must be training hardware "
                f"past the checkpoints' evaluation (100-{TRAIN_HARDWARE.stop - 1})"
            )
        if self.keep < 1 or self.episodes < 1:
            raise ValueError("keep at least one candidate, score at least one episode a point")


@dataclass(frozen=True)
class DistillConfig:
    """`edgeroute train qos-distill`'s settings (`edgeroute.qos.distill`)."""

    states: int = 200_000  # states the teacher visits, kept for the student to learn
    epochs: int = 8
    batch: int = 256
    lr: float = 1e-3
    drawn_share: float = 0.5  # of the worlds acted by draws; the rest by argmax
    held_out: float = 0.05  # of the states, kept aside to measure the copy on
    seed: int = 0
    # 1: the teacher's states alone; each further round adds states // 2 where the
    # student acts, labelled by the teacher (DAgger), and epochs // 2 passes
    rounds: int = 1
