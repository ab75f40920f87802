"""Which of a reward's actors to serve, picked in its training worlds.

A reward's training runs (and the students distilled from them) differ, and live the
weakest one served decides most verdicts: it herds, or falls behind at one load, and
its seeds widen the reward's interval (docs/research.md, "Picking the served actors in
the training worlds"). Picking the served actors by their evaluation on the live
engines would be picking on the test. This picks them where they trained: training
hardware (seeds no checkpoint was chosen on), the agent's share of the prompts and the
predictor it trained with, at every point of the paper's sweep (N, lambda, L), several
episodes each on the same worlds for every candidate.

The criterion is the worst point: a candidate's shortfall at a point is its mean QoS
there minus the best candidate's, and its score is its largest shortfall over the
points; the `keep` candidates whose worst point is closest to the best are served.
A run that is fine on average but weak at one load is what this drops.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from edgeroute.qos.config import SWEEP_POINTS, Point, SelectConfig, TrainConfig, read_record
from edgeroute.qos.distill import OnnxActor
from edgeroute.qos.ensemble import MAY_DIFFER as ENSEMBLE_MAY_DIFFER
from edgeroute.qos.ensemble import common_config
from edgeroute.qos.evaluate import evaluate
from edgeroute.qos.train import experts_for, make_env

# What candidates of one selection may differ in besides what an ensemble's members
# may: how often their training evaluated them, which does not change their world.
MAY_DIFFER = ENSEMBLE_MAY_DIFFER | {"eval_every"}


def shortfalls(scores: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Each candidate's worst point: the least, over the points, of its score minus
    the best candidate's there (0 for a candidate best everywhere)."""
    points = next(iter(scores.values())).keys()
    best = {p: max(s[p] for s in scores.values()) for p in points}
    return {name: min(s[p] - best[p] for p in points) for name, s in scores.items()}


def picked(scores: Mapping[str, Mapping[str, float]], keep: int) -> list[str]:
    """The `keep` candidates with the smallest worst shortfall (ties: the higher mean
    over the points, then the name)."""
    worst = shortfalls(scores)
    ranked = sorted(scores, key=lambda n: (-worst[n], -statistics.fmean(scores[n].values()), n))
    return ranked[:keep]


def shared_config(candidates: Sequence[Path]) -> TrainConfig:
    """The training config the candidates share (all but `MAY_DIFFER`): the world
    they are scored in. Refuses candidates trained otherwise."""
    # read through TrainConfig, so that an older record's missing keys are defaults
    configs = {c: TrainConfig.from_record(read_record(c)["config"]) for c in candidates}
    common_config({c: {"config": asdict(t)} for c, t in configs.items()}, MAY_DIFFER)
    return configs[candidates[0]]


def scored(
    candidates: Sequence[Path],
    data_dir: Path,
    sc: SelectConfig,
    points: Sequence[Point] = SWEEP_POINTS,
    progress: Callable[[str], None] = print,
) -> dict[str, dict[str, float]]:
    """Each candidate's mean QoS at each point, over `sc.episodes` episodes on the same
    training hardware and arrivals for every candidate."""
    cfg = shared_config(candidates)
    env = make_env(cfg, data_dir, episode_len=sc.episode_len)
    out: dict[str, dict[str, float]] = {}
    for c in candidates:
        policy = OnnxActor(c / "actor.onnx").policy()
        mine: dict[str, float] = {}
        for p in points:
            qos = []
            for e in range(sc.episodes):
                env.reset(
                    experts=experts_for(cfg, sc.first_hardware + e, p.n),
                    rate=p.rate,
                    latency_req=p.latency_ms / 1000,
                )
                qos.append(evaluate(env, policy, [sc.seed * 10_000 + e]).qos)
            mine[p.label] = statistics.fmean(qos)
        out[str(c)] = mine
        progress(
            f"{c.name}: mean {statistics.fmean(mine.values()):.3f}, lowest point "
            + min(mine, key=mine.__getitem__)
        )
    return out


def select(
    candidates: Sequence[Path],
    data_dir: Path,
    sc: SelectConfig,
    points: Sequence[Point] = SWEEP_POINTS,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The candidates' scores, worst shortfalls and the `sc.keep` picked, as a record."""
    if len(candidates) < sc.keep:
        raise ValueError(f"{len(candidates)} candidates, {sc.keep} to keep")
    scores = scored(candidates, data_dir, sc, points, progress)
    return {
        "select": asdict(sc),
        "points": [asdict(p) for p in points],
        "scores": scores,
        "worst_shortfall": shortfalls(scores),
        "picked": picked(scores, sc.keep),
    }


__all__ = [
    "picked",
    "scored",
    "select",
    "shared_config",
    "shortfalls",
]
