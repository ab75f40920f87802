"""The QoS router against the paper's baselines: `edgeroute bench qos`.

Every trained agent is the gateway's own `qos_drl` policy object (its ONNX actor and
predictor, onnxruntime), driven through the `ClusterView` the gateway builds
(`edgeroute.qos.evaluate.served`), on the same arrivals and seeds as BR (the
BERT-router baseline: best predicted score), RR, SQF, SQF with ties broken by the
predicted score, and the gateway's `least_load`; and, as references that are no
contenders, SQF with ties broken by the true score, a rule that keeps the experts able
to meet L from overload by reading their time constants, and a ceiling no policy can
pass (`edgeroute.qos.bound`).
Predictions are the served predictor's real outputs, and the prompts are the
evaluation split, which neither the predictor nor the agent trained on. Settings: the
paper's default (N=6, lambda=5, L=30 ms), sweeps of N, lambda and L, and arrivals from
an Azure LLM trace. 10 environment seeds per point (95% intervals). Also: the policy's
decision latency, features and predictor included, at N=6 and 12 with full queues.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgeroute.bench.policies import measure_qos_drl
from edgeroute.qos.bound import contention_free
from edgeroute.qos.config import (
    DEFAULT_LATENCY_MS,
    DEFAULT_RATE,
    QUALITY_PROMPTS,
    SWEEP_POINTS,
    Serving,
    best_predicted,
    quality_dir,
    quality_flag,
    quality_suffix,
    trained_fleet,
    trained_latencies,
    trained_rates,
)
from edgeroute.qos.evaluate import BASELINES, REFERENCES, Policy, Score, evaluate, served
from edgeroute.results_io import output_dir, recorded, save_figure, table, write
from edgeroute.sim.edge import (
    QUALITY_MODELS,
    Arrival,
    EdgeEnv,
    EdgeExpert,
    Fleet,
    Quality,
    ServedPredictor,
    Task,
    default_experts,
    engine_experts,
    held_out_hardware,
    load_tasks,
    trace_arrivals,
)
from edgeroute.sim.workload import TraceRequest, read_trace, trace_kind
from edgeroute.stats import (
    crossed_interval,
    crossed_paired_shown,
    interval,
    interval_shown,
    paired_each,
    shown,
    verdict,
)
from policies import PipelineSpec, build_pipeline
from policies.predictor import load_predictor, predictor_dir
from policies.qos_drl import load

# Not a policy: each request's best QoS alone, by the truth (`edgeroute.qos.bound`).
BOUND = "bound (truth, no contention)"
Measure = Callable[[EdgeEnv, list[int]], Score]  # an episode per seed, scored


def scoring(policy: Policy) -> Measure:
    """How a policy is measured: `evaluate` it."""
    return lambda env, seeds: evaluate(env, policy, seeds)


PAPER_CLAIM = "the full agent beats Baseline RL by 35.78% on average QoS, and every baseline"


VARIANTS = ("full", "dsa", "baseline")

# Where a simulated sweep's experts come from: hardware seed 0 at every point (with one
# point on held-out draws and one on the live engines), the k-th held-out draw for
# environment seed k at every point, or the live run's engine profiles at every point.
Hardware = Literal["seed-0", "held-out", "engines"]


def trained_runs(quality: Quality = "routerbench") -> dict[str, list[Path]]:
    """Each variant's training runs (one folder per training seed) that hold an actor."""
    runs = quality_dir(quality) / "runs"
    found = {v: sorted(p.parent for p in runs.glob(f"{v}-s*/actor.onnx")) for v in VARIANTS}
    return {v: dirs for v, dirs in found.items() if dirs}


# qos_drl's serving parameters as flags that name an agent: the flag and the value it sets.
SERVING_FLAGS = {
    "shed": ("--no-shed", False),
    "sample": ("--sample", True),
    "speed_prior": ("--speed-prior", True),
}


def serving_from(names: Mapping[str, Sequence[str]]) -> Serving:
    """The agents' serving parameters from the agents each flag of SERVING_FLAGS
    names, by parameter (`{"shed": <the names given to --no-shed>, ...}`)."""
    serving: Serving = {}
    for param, agents in names.items():
        for name in agents:
            serving.setdefault(name, {})[param] = SERVING_FLAGS[param][1]
    return serving


def recorded_serving(command: str) -> Serving:
    """The agents' serving parameters (`--no-shed NAME`, `--sample NAME`, ...) in a results
    file's command."""
    words = shlex.split(command)
    serving: Serving = {}
    for param, (flag, value) in SERVING_FLAGS.items():
        for i, word in enumerate(words[:-1]):
            if word == flag:
                serving.setdefault(words[i + 1], {})[param] = value
    return serving


def refuse_other_serving(name: str, serving: Serving, quick: bool) -> None:
    """Refuse (SystemExit) a run whose results `name` would overwrite tracked results of
    the same agents served otherwise: results are named by their agents, not by how
    they are served (SERVING_FLAGS), so such a run names its agents apart
    (`NAME-drawn`). A quick run writes elsewhere and is not held to it."""
    path = output_dir(False) / f"{name}.json"
    if quick or not path.exists():
        return
    try:
        command = str(json.loads(path.read_text())["config"]["command"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # not a results file this check can read; `write` reports what it replaces
    if recorded_serving(command) != serving:
        raise SystemExit(
            f"{path.name} holds these agents served otherwise (`{command}`); give the "
            "agents other names (`--model NAME-drawn=...`) rather than overwrite it"
        )


def agents_named(
    base: str, models: dict[str, list[Path]], serving: Serving | None = None
) -> tuple[str, str]:
    """The results' name and the command's `--model` (and SERVING_FLAGS')
    flags for agents given by hand: they get a file of their own
    (`<base>_<agent>...`), so that benchmarking other runs never overwrites the
    results of the committed ones. No agents given: `base`."""
    if not models:
        return base, ""
    serving = serving or {}
    safe = [re.sub(r"[^A-Za-z0-9_-]+", "-", k) for k in models]
    flags = "".join(f" --model {k}={','.join(map(str, v))}" for k, v in models.items())
    for param, (flag, _) in SERVING_FLAGS.items():
        flags += "".join(f" {flag} {k}" for k in models if param in serving.get(k, {}))
    return "_".join([base, *safe]), flags


def check_serving(models: dict[str, list[Path]], serving: Serving) -> None:
    """The flags of SERVING_FLAGS name agents given with `--model`."""
    for param, (flag, _) in SERVING_FLAGS.items():
        unknown = sorted(k for k, v in serving.items() if param in v and k not in models)
        if unknown:
            raise SystemExit(f"{flag} {', '.join(unknown)}: no such agent given with --model")


def scrape_named(base: str, scrape_ms: float | None) -> tuple[str, str]:
    """The results' name and flag for a scrape of the engines' metrics every
    `scrape_ms` (None: the world's default): another world, so results of its own."""
    if scrape_ms is None:
        return base, ""
    return f"{base}_scrape-{scrape_ms:g}ms", f" --scrape-ms {scrape_ms:g}"


def trace_named(base: str, trace: Path | None) -> tuple[str, str]:
    """The results' name and flag for the trace point read from `trace` (None: the
    data folder's Azure conversation trace): another workload, so results of its own."""
    if trace is None:
        return base, ""
    return f"{base}_trace-{trace.name.split('.')[0]}", f" --trace {recorded(trace)}"


@dataclass(frozen=True)
class Physics:
    """What the simulated engines do beyond their profiles: run `time_scale` times
    slower (1.02: 2% slower than profiled, as the live run's engines are), and keep the
    emulated worker's prefix cache (as the live run's engines do). The default is the
    world the agents trained in: the profiles as they are, no cache."""

    time_scale: float = 1.0
    prefix_cache: bool = False

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ValueError(f"the time scale must be > 0, not {self.time_scale:g}")

    def experts(self, experts: list[EdgeExpert]) -> list[EdgeExpert]:
        """`experts` with their time constants (base, per prefill token, per context
        token) scaled."""
        f = self.time_scale
        if f == 1.0:
            return experts
        return [replace(e, base=e.base * f, k1=e.k1 * f, k2=e.k2 * f) for e in experts]

    def named(self, base: str) -> tuple[str, str]:
        """The results' name and the flags that give this world."""
        flags = ""
        if self.time_scale != 1.0:
            base += f"_time-x{self.time_scale:g}"
            flags += f" --time-scale {self.time_scale:g}"
        if self.prefix_cache:
            base += "_prefix-cache"
            flags += " --prefix-cache"
        return base, flags

    def describe(self) -> str:
        """For a results file's notes: how this world differs from the profiles ("" if
        it does not)."""
        said = []
        if self.time_scale != 1.0:
            said.append(
                "every expert's time constants (base, per prefill token, per context "
                f"token) multiplied by {self.time_scale:g} (`--time-scale`)"
            )
        if self.prefix_cache:
            said.append(
                "every expert keeping the emulated engine's prefix cache, so that a prompt "
                "it has seen skips the prefill of its cached blocks (`--prefix-cache`)"
            )
        return ", ".join(said)


def run_predictor(
    quality: Quality, predictor: Path | None, models: Mapping[str, Sequence[Path]]
) -> Path:
    """The predictor folder every policy of a run reads: `predictor`, else the quality
    world's. An agent that trained with another is refused: it would be measured with
    predictions it never saw."""
    want = (predictor or quality_dir(quality)).resolve()
    record = json.loads((want / "predictor.json").read_text())
    if set(record["models"]) != set(QUALITY_MODELS[quality]):
        raise SystemExit(f"{want}: its predictor is not of the {quality} world's models")
    shown = f"the {quality} world's" if predictor is None else str(want)
    for runs in models.values():
        for run in runs:
            if (own := predictor_dir(run)) != want:
                raise SystemExit(f"{run}: its predictor ({own}) is not {shown}")
    return want


def predictor_named(base: str, quality: Quality, predictor: Path) -> tuple[str, str]:
    """The results' name and flag for a predictor other than the world's."""
    if predictor == quality_dir(quality).resolve():
        return base, ""
    shown = recorded(predictor)
    return f"{base}_predictor-{predictor.name}", f" --predictor {shown}"


def heuristics(quality: Quality, predictor: Path | None = None) -> dict[str, Policy]:
    """The heuristics every sweep measures: BR (the gateway's `best_predicted` with the
    world's predictor, or the one in folder `predictor`), RR, SQF, SQF+predicted and
    least-load by the engines' queues."""
    return {
        "BR": served(build_pipeline(PipelineSpec(**best_predicted(quality, predictor)))),
        **BASELINES,
        "least_load": served(build_pipeline(PipelineSpec(policy="least_load"))),
    }


def variant_named(
    base: str,
    first_seed: int = 1,
    hardware: Hardware = "seed-0",
    seeds: int | None = None,
    physics: Physics = Physics(),
) -> tuple[str, str]:
    """The results' name and flags for other samples of a world: the hardware of every
    point (`Hardware`), other physics (`Physics`), environment seeds from another first
    one, or another number of them (None: the mode's default). Results of their own, so
    that the committed ones stay what their command says."""
    flags = ""
    if hardware == "held-out":
        base += "_held-out-hw"
        flags += " --held-out-hardware"
    elif hardware == "engines":
        base += "_engine-hw"
        flags += " --engine-hardware"
    base, more = physics.named(base)
    flags += more
    if first_seed != 1:
        base += f"_seed-{first_seed}"
        flags += f" --seed {first_seed}"
    if seeds is not None:
        base += f"_seeds-{seeds}"
        flags += f" --seeds {seeds}"
    return base, flags


@dataclass(frozen=True)
class Sweep:
    """What every episode of a simulated sweep shares: the evaluation prompts, the
    served predictor, the trace, the quality world, how the experts are drawn, the
    hardware of every point, the episode's length and the scrape."""

    tasks: list[Task]
    predictor: ServedPredictor
    trace: Sequence[TraceRequest]
    quality: Quality = "routerbench"
    fleet: Fleet = Fleet()
    hardware: Hardware = "seed-0"
    episode: int = 512
    scrape_ms: float | None = None
    physics: Physics = Physics()

    @classmethod
    def of(
        cls, quality: Quality, data_dir: Path, predictor: Path | None = None, **kw: Any
    ) -> Sweep:
        """The `quality` world's sweep: its evaluation prompts in `data_dir` and its
        served predictor (or the one in folder `predictor`), no trace unless given, the
        rest as `kw` says."""
        kw.setdefault("trace", ())
        return cls(
            tasks=load_tasks(data_dir, split="eval", quality=quality),
            predictor=ServedPredictor(load_predictor(predictor or quality_dir(quality))),
            quality=quality,
            **kw,
        )

    def env(
        self,
        k: int,
        n: int = 6,
        rate: float = DEFAULT_RATE,
        latency_ms: float = DEFAULT_LATENCY_MS,
        arrivals: bool = False,
        on: Hardware | None = None,
        stream: Sequence[Arrival] | None = None,
    ) -> EdgeEnv:
        """The k-th environment seed's episode with `n` experts `on` hardware seed 0 (no
        agent trained on it), the k-th held-out hardware or the live run's engines (by
        default the sweep's); a trace is read from its k-th window. `stream`: the
        arrivals of every episode instead, each with its prompt (`bench qos-replay`),
        all but the last routed."""
        on = on or self.hardware
        models = QUALITY_MODELS[self.quality]
        drawn = held_out_hardware(k) if on == "held-out" else 0
        experts = (
            engine_experts(models, n)
            if on == "engines"
            else default_experts(n, seed=drawn, models=models, fleet=self.fleet)
        )
        given: Iterator[Arrival] | Sequence[Arrival] | None = stream
        if stream is None and arrivals:
            given = trace_arrivals(self.trace, rate, start=k * self.episode)
        return EdgeEnv(
            self.physics.experts(experts),
            self.tasks,
            rate=rate,
            latency_req=latency_ms / 1000,
            episode_len=self.episode if stream is None else len(stream) - 1,
            predictor=self.predictor,
            arrivals=given,
            scrape=None if self.scrape_ms is None else self.scrape_ms / 1000,
            prefix_cache=self.physics.prefix_cache,
        )


def timed_trace(path: Path) -> tuple[str, list[TraceRequest]]:
    """A trace's requests and its point's label (`azure trace`, `mooncake trace`), from
    any file of a format with arrival instants and token counts. A prompt set, which
    has neither, or a file of no known format is a ValueError saying so."""
    kind = trace_kind(path)
    if kind == "prompt set":
        raise ValueError(
            f"--trace: {path} is a prompt set, without arrival instants or token counts; "
            "give a Mooncake JSONL or an Azure CSV trace"
        )
    return f"{kind} trace", read_trace(path, kind)


def main(
    quick: bool,
    seed: int,
    json_path: str | None,
    models: dict[str, list[Path]],
    trace: str | None,
    quality: Quality = "routerbench",
    scrape_ms: float | None = None,
    fleet: Fleet = Fleet(),
    serving: Serving | None = None,
    hardware: Hardware = "seed-0",
    n_seeds: int | None = None,
    physics: Physics = Physics(),
    predictor: Path | None = None,
) -> None:
    """`models`: each agent's training runs; by default every run in the quality
    world's runs/. An agent's figure on an environment seed is the mean of its
    training runs there, and its interval is over the environment seeds; the first
    agent is also judged against the best of the others, and compared seed by seed
    with each. `scrape_ms`:
    the policies see the experts as the gateway does, from scrapes of the engines'
    metrics that far apart (`edgeroute.sim.edge.cluster_view`); by default, their exact
    state. `fleet`: how the experts are drawn (the paper's by default; give the one the
    agents trained on, `edgeroute train qos`'s same options). `serving`: agents served
    with other parameters (`shed=False`: never drop; `sample=True`: act by a draw;
    `speed_prior=True`: read unmeasured experts at the mean measured speed).
    `hardware`: every point on hardware seed 0 (the default), environment seed k on
    the k-th held-out draw (`held-out`), or every point on the live run's engine
    profiles, N of them cycled (`engines`: one fleet no agent trained on, so that the
    intervals hold the workload's spread and not the draws'). `n_seeds`: environment seeds per point
    (None: 10, or 1 for a quick run). `physics`: what the experts do beyond their
    profiles (`Physics`: slower, a prefix cache). `predictor`: the folder of the
    predictor every policy reads (by default the world's; agents must have trained
    with it)."""
    from workers.quality import default_data_dir

    serving = serving or {}
    check_serving(models, serving)
    data = default_data_dir()
    usual = 1 if quick else 10
    seeds = [seed + 100 + i for i in range(n_seeds or usual)]
    episode = 256 if quick else 512
    base, scrape_flag = scrape_named("qos" + quality_suffix(quality) + fleet.suffix(), scrape_ms)
    base, variant_flags = variant_named(
        base, seed, hardware, None if n_seeds == usual else n_seeds, physics
    )
    base, trace_flag = trace_named(base, None if trace is None else Path(trace))
    given, models = models, models or trained_runs(quality)
    predictor = run_predictor(quality, predictor, models)
    base, predictor_flag = predictor_named(base, quality, predictor)
    result_name, model_flags = agents_named(base, given, serving)
    refuse_other_serving(result_name, serving, quick)
    fixed = {k: [scoring(v)] for k, v in heuristics(quality, predictor).items()}
    fixed.update({k: [scoring(v)] for k, v in REFERENCES.items()})
    fixed[BOUND] = [contention_free]

    # An agent normalises its features by the latency target it serves, so each
    # setting's L gets its own policy for every run (as a gateway configured for it),
    # all of them sharing the run's actor session and the run's predictor session.
    def policies_at(latency_ms: float) -> dict[str, list[Measure]]:
        agents = {
            n: [scoring(served(load(d, latency_ms, **serving.get(n, {})))) for d in dirs]
            for n, dirs in models.items()
        }
        return {**fixed, **agents}

    trace_path = Path(trace or data / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv.gz")
    trace_name, trace_requests = timed_trace(trace_path)
    sweep = Sweep.of(
        quality,
        data,
        predictor,
        trace=trace_requests,  # once: every environment reads a window of it
        fleet=fleet,
        hardware=hardware,
        episode=episode,
        scrape_ms=scrape_ms,
        physics=physics,
    )

    settings: list[tuple[str, dict[str, Any]]] = [("default", {})]
    if not quick:
        settings += [
            (p.label, {"n": p.n, "rate": p.rate, "latency_ms": p.latency_ms})
            for p in SWEEP_POINTS[1:]
        ]
        # a point of its own on the hardware that the sweep's other points are not on
        if hardware == "seed-0":
            settings.append(("held-out hardware", {"on": "held-out"}))
        if hardware != "engines":
            settings.append(("live engines", {"on": "engines"}))
    # Environment seed k reads the trace from its (k * episode)-th request: one arrival
    # at the environment's construction, one at `evaluate`'s reset and one per decision,
    # so a window reads episode + 2. A trace too short for every seed gives its point
    # the seeds it has windows for, and says so.
    windows = max(0, len(sweep.trace) - 2) // episode
    if windows == 0:
        raise SystemExit(f"{trace_path} holds fewer than {episode + 2} requests: not one episode")
    trace_seeds = seeds[:windows]
    trace_label = trace_name + (
        f" ({windows} of the {len(seeds)} seeds: the trace's windows of {episode})"
        if windows < len(seeds)
        else ""
    )
    settings.append((trace_label, {"arrivals": True}))
    rows: list[dict[str, Any]] = []
    for label, kw in settings:
        at = trace_seeds if kw.get("arrivals") else seeds
        for name, runs in policies_at(kw.get("latency_ms", DEFAULT_LATENCY_MS)).items():
            per_run = [
                [measure(sweep.env(k, **kw), [one_seed]) for k, one_seed in enumerate(at)]
                for measure in runs
            ]
            scores = [x for run in per_run for x in run]
            # The sample is the environment seed: an agent's training runs on one seed
            # share its world (hardware, arrivals, prompts), so they are averaged
            # there, not counted as more samples of the world.
            qos = [statistics.fmean(run[k].qos for run in per_run) for k in range(len(at))]
            rows.append(
                {
                    "setting": label,
                    "policy": name if len(runs) == 1 else f"{name} ({len(runs)} seeds)",
                    "agent": name in models,
                    "reference": name in REFERENCES or name == BOUND,
                    "qos": interval(qos)[0],
                    "qos_ci": shown(qos),
                    "latency_ms": statistics.fmean(x.latency_ms for x in scores),
                    "drop_rate": statistics.fmean(x.drop_rate for x in scores),
                    "per_seed_qos": qos,
                    "per_run_qos": [[x.qos for x in r] for r in per_run],
                    "per_training_seed_qos": [statistics.fmean(x.qos for x in r) for r in per_run],
                }
            )
        here = [r for r in rows if r["setting"] == label]
        best = judge(here)
        agents = [r for r in here if r["agent"]]
        print(
            f"  {label:<18} best baseline: {best['policy']} ({best['qos_ci']}); "
            + ", ".join(
                f"{r['policy']}: {r['qos_ci']} {r['against_best']} "
                f"(counting runs {r['qos_ci_runs']} {r['against_best_runs']})"
                for r in agents
            )
            + (
                f"; first agent against the others: {agents[0]['against_agents']} "
                f"(counting runs {agents[0]['against_agents_runs']})"
                if len(agents) > 1
                else ""
            ),
            flush=True,
        )
    latency = [
        {
            **measure_qos_drl(
                n,
                *((300, 1) if quick else (2000, 3)),
                load(runs[0], DEFAULT_LATENCY_MS, **serving.get(name, {})),
            ),
            "policy": name,
        }
        for name, runs in models.items()
        for n in (6, 12)
    ]
    rates = sorted({trained_rates(d) for dirs in models.values() for d in dirs})
    latencies = sorted({trained_latencies(d) for dirs in models.values() for d in dirs})
    fleets = sorted({trained_fleet(d).describe() for dirs in models.values() for d in dirs})
    notes = [
        f"Paper's claim: {PAPER_CLAIM}. Agents trained at N=6 with lambda drawn in "
        f"{' or '.join(rates)} and L in {' or '.join(latencies)} per episode, on hardware seeds 1-10000 "
        f"({'; or '.join(fleets)}; evaluated on "
        f"{'the live engines' if hardware == 'engines' else fleet.describe()}) and the agent split "
        "of the prompts, and are evaluated unchanged here (pointer heads take any N). "
        f"Environment seeds {seeds[0]}-{seeds[-1]}, {episode} decisions each; an agent's "
        "figure on a seed is the mean of its training runs there, and intervals are over "
        "the environment seeds (`qos_ci`: mean and 95% half-width). Predictions are the "
        "served predictor's own outputs; prompts are "
        f"the evaluation split ({len(sweep.tasks)} {QUALITY_PROMPTS[quality]}; no model here trained on "
        "them). "
        + {
            "seed-0": "Hardware is seed 0 or, for `held-out hardware`, seeds "
            f"{held_out_hardware(0)}-{held_out_hardware(len(seeds) - 1)}: none trained on; "
            "`live engines` are ",
            "held-out": f"Hardware is seed {held_out_hardware(0)} + k for environment seed "
            "k at every point (`--held-out-hardware`): none trained on; `live engines` are ",
            "engines": "Hardware is, at every point (`--engine-hardware`), ",
        }[hardware]
        + "the six engine profiles of `bench qos --live` (their own time constants, "
        "batch caps and KV memory, whatever the fleet"
        + (
            "; N of them cycled, as the live run's `--engines` has them"
            if hardware == "engines"
            else ""
        )
        + ")"
        + (f", {physics.describe()}" if physics.describe() else "")
        + ". The trace "
        f"setting reads window k of `{trace_path.name}` (its instants rescaled to 5/s, its "
        "token counts) for environment seed k. `against_best`: whether the agent's 95% "
        "interval lies above (`wins`), below (`loses`) or overlaps (`tie`) the best "
        "heuristic's; `against_agents`: the first agent's against the best other agent's "
        "(the issue's test); `paired_minus_agents`: the first agent minus each other "
        "agent seed by seed, a test the same worlds make sharper, given beside it. "
        "The `_runs` columns are the same, counting the agents' training runs as a second "
        "source of spread beside the environment seeds (`edgeroute.stats."
        "crossed_interval`): whether training the agents again would give the verdict, "
        "not only these runs. "
        "`SQF+truth` reads each model's real score on the request: it is "
        "not a contender (no router has it) but shows what the same rule gains from "
        "perfect predictions, against `SQF+predicted` with the served ones. "
        "`protective, cap 2` reads the experts' time constants, which no router has: of "
        "the experts where the request, at its predicted length, would meet L alone and "
        "which hold fewer than 2 requests, it takes the one of the best predicted score, "
        "and else sends the request to the slowest expert (where it scores 0 as a drop "
        "would, taking no room from the others): what keeping the experts that can meet "
        "L from overload is worth (`edgeroute.qos.evaluate.protective`). "
        f"`{BOUND}` is no policy but a ceiling on every policy's QoS "
        "(`edgeroute.qos.bound`): each request's best real score over the experts "
        "where its latency per token alone (no queue, no batch, its prompt cached if "
        "the world caches) meets L; its latency is that alone, its drop rate the share "
        "of requests no expert could serve above 0 even so."
        + (
            ""
            if scrape_ms is None
            else f" Policies that read the engines' state see it as the gateway does, from "
            f"scrapes of their metrics every {scrape_ms:g} ms (counts and memory as of the "
            "last scrape, progress estimated); SQF and its variants read the exact queues."
        )
    ]
    if latency:
        notes.append(
            "## Decision latency (features + ONNX, one core, full queues)\n\n"
            + table(latency, ["policy", "backends", "decision_us_p50", "decision_us_p99"])
        )
    write(
        result_name,
        {
            "command": "edgeroute bench qos"
            + (" --quick" if quick else "")
            + quality_flag(quality)
            + fleet.flags()
            + scrape_flag
            + variant_flags
            + trace_flag
            + predictor_flag
            + model_flags,
            "models": {k: [recorded(d) for d in v] for k, v in models.items()},
            "seeds": seeds,
        },
        rows,
        COLUMNS,
        json_path,
        notes="\n\n".join(notes),
        quick=quick,
    )
    plot(rows, output_dir(quick) / f"{result_name}.png")


# The results table's columns: each policy's figures and `judge`'s verdicts.
COLUMNS = [
    "setting",
    "policy",
    "qos_ci",
    "latency_ms",
    "drop_rate",
    "against_best",
    "against_agents",
    "paired_minus_agents",
    "qos_ci_runs",
    "against_best_runs",
    "against_agents_runs",
    "paired_minus_agents_runs",
]


def judge(here: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdicts of one setting's rows, set on them: every agent against the best
    heuristic (`against_best`) and the first agent against the best other agent
    (`against_agents`, the issue's test) with the first agent's paired differences
    (`paired_minus_agents`); each once with intervals over the environment seeds and
    once counting the agents' training runs too (`..._runs`, `stats.crossed_interval`).
    Returns the best heuristic's row. Rows need `per_seed_qos` and `per_run_qos`."""
    # Each row's interval over the seeds and counting runs, once (policies are unique).
    by_seed = {r["policy"]: interval(r["per_seed_qos"]) for r in here}
    by_run = {r["policy"]: crossed_interval(r["per_run_qos"]) for r in here}
    for r in here:
        r["qos_ci_runs"] = interval_shown(*by_run[r["policy"]])
    best = max((r for r in here if not r["agent"] and not r["reference"]), key=lambda r: r["qos"])
    agents = [r for r in here if r["agent"]]
    for r in agents:
        r["against_best"] = verdict(by_seed[r["policy"]], by_seed[best["policy"]])
        r["against_best_runs"] = verdict(by_run[r["policy"]], by_seed[best["policy"]])
    if len(agents) > 1:
        first, others = agents[0], agents[1:]
        rival = max(others, key=lambda r: r["qos"])
        for key, cis in (("against_agents", by_seed), ("against_agents_runs", by_run)):
            first[key] = (
                f"{verdict(cis[first['policy']], cis[rival['policy']])} ({rival['policy']})"
            )
        first["paired_minus_agents"] = paired_each(
            first["per_seed_qos"], {r["policy"]: r["per_seed_qos"] for r in others}
        )
        first["paired_minus_agents_runs"] = "; ".join(
            f"{r['policy']}: {crossed_paired_shown(first['per_run_qos'], r['per_run_qos'])}"
            for r in others
        )
    return best


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows if r["policy"] != BOUND))
    fig, ax = plt.subplots(figsize=(max(8, len(settings) * 0.9) + 3, 4))
    width = 0.8 / len(policies)
    for i, p in enumerate(policies):
        vals = [
            next((r["qos"] for r in rows if r["setting"] == s and r["policy"] == p), 0.0)
            for s in settings
        ]
        reference = any(r["policy"] == p and r.get("reference") for r in rows)
        ax.bar(
            np.arange(len(settings)) + i * width,
            vals,
            width,
            label=p,
            hatch="//" if reference else None,
            fill=not reference,
        )
    # the ceiling over each setting's bars, a line rather than a bar: no policy's
    bounds = {settings.index(r["setting"]): r["qos"] for r in rows if r["policy"] == BOUND}
    if bounds:
        at = np.array(list(bounds))
        ax.hlines(
            list(bounds.values()),
            at - width / 2,
            at + 0.8 - width / 2,
            colors="black",
            linewidths=2,
            label=BOUND,
        )
    ax.set_xticks(np.arange(len(settings)) + 0.4, settings, rotation=30, fontsize=8)
    ax.set_ylabel("average QoS")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    save_figure(fig, out)
