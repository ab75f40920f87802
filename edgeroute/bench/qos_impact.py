"""How well eq. 15 estimates a routing decision's impact: `edgeroute bench qos-impact`.

Along each policy's own trajectory in the edge-expert simulator, every routed decision
gets eq. 15's penalty (as written, "reached", and read as "pushed") and the true
impact: the QoS the chosen expert's other requests lose because the arrival joined
(`EdgeEnv.counterfactual_impact`: the expert's future with and without it when nothing
more arrives, true lengths and scores), and that counted in hindsight, with the requests
routed there while it ran (`EdgeEnv.hindsight_impact`). An estimator that fires where no QoS is lost
teaches the agent to avoid harmless decisions; one that stays silent where QoS is lost
teaches nothing. Each decision's `room` (`EdgeEnv.impact_room`) bounds what any impact
term can buy there with nothing more arriving, and `room_hindsight`
(`EdgeEnv.hindsight_room`) what it can buy counting the requests routed after it.
`shared` is the hindsight impact with each loss shared among the requests that each
caused it (`EdgeEnv.hindsight_charges`): where the hindsight impacts add up to several
times what the requests lost to one another, these add up to it.
Settings: the paper's default and its sweeps of lambda and L.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from edgeroute.bench.qos import (
    Hardware,
    agents_named,
    predictor_named,
    run_predictor,
    scrape_named,
    trained_runs,
    variant_named,
)
from edgeroute.qos.config import SWEEP_POINTS, Point, quality_flag, quality_suffix
from edgeroute.qos.evaluate import BASELINES, Policy, served
from edgeroute.results_io import recorded, write
from edgeroute.sim.edge import (
    QUALITY_MODELS,
    EdgeEnv,
    Fleet,
    Impact,
    Quality,
    ServedPredictor,
    default_experts,
    engine_experts,
    held_out_hardware,
    load_tasks,
)
from policies.predictor import load_predictor
from policies.qos_drl import load

ESTIMATORS: tuple[Impact, ...] = ("reached", "pushed")


def points_named(labels: list[str] | None) -> list[Point]:
    """The sweep points of `labels` (as `bench qos` names them: "default", "N=12",
    "L=40ms"), in the sweep's order; by default those of six experts, the default and
    the sweeps of lambda and L."""
    if labels is None:
        return [p for p in SWEEP_POINTS if p.n == 6]
    known = {p.label for p in SWEEP_POINTS}
    if unknown := [x for x in labels if x not in known]:
        raise SystemExit(f"no sweep point {', '.join(unknown)}: one of {', '.join(sorted(known))}")
    return [p for p in SWEEP_POINTS if p.label in labels]


def trajectory(env: EdgeEnv, policy: Policy, seed: int) -> list[dict[str, float]]:
    """Each routed decision's estimates, true impact and hindsight impact along one
    episode, run to its end. `env` keeps what the hindsight needs (impact "hindsight",
    reward "qos"); its own reward is not read."""
    if env.impact != "hindsight" or env.reward_kind != "qos":
        raise ValueError("the trajectory's environment must record the hindsight impact")
    routed = []
    env.reset(seed)
    done, i = False, 0
    while not done:
        action = policy(env, i)
        n = action - 1
        row = None
        if action and not env.experts[n].refuses():
            options = env.options()
            row = {
                "true": env.counterfactual_impact(n, env.request_for(n)),
                "reached": env.estimated_impact(n),
                "pushed": env.estimated_impact(n, pushed=True),
                "room": env.impact_room(options),
            }
        _, done = env.step(action)
        if row is not None and env.last_request is not None:
            routed.append((row, env.last_request, options))
        i += 1
    env.drain()
    charges = env.hindsight_charges()
    for row, req, options in routed:
        row["hindsight"], row["shared"] = charges[req]
        row["room_hindsight"] = env.hindsight_room(options, req)
    return [row for row, _, _ in routed]


def summary(decisions: list[dict[str, float]], kind: str) -> dict[str, Any]:
    """Precision: of the decisions the estimator penalises, the share that cost QoS;
    recall: of those that cost QoS, the share it penalises."""
    fired = [d for d in decisions if d[kind] > 0]
    harmful = [d for d in decisions if d["true"] > 0]
    return {
        "fires": len(fired) / len(decisions),
        "precision": sum(d["true"] > 0 for d in fired) / len(fired) if fired else None,
        "recall": sum(d[kind] > 0 for d in harmful) / len(harmful) if harmful else None,
        "mean_estimate": statistics.fmean(d[kind] for d in decisions),
    }


def main(
    quick: bool,
    seed: int,
    json_path: str | None,
    models: dict[str, list[Path]],
    quality: Quality = "routerbench",
    fleet: Fleet = Fleet(),
    hardware: Hardware = "seed-0",
    scrape_ms: float | None = None,
    predictor: Path | None = None,
    settings: list[str] | None = None,
) -> None:
    """`models`: agents whose trajectories are measured, first run of each; by default
    the quality world's full and dsa runs. SQF's trajectory is measured too. `fleet`:
    how the experts are drawn (the paper's by default); `hardware`: every seed on
    hardware seed 0, environment seed k on the k-th held-out draw, or every seed on the
    live run's engines (N of them, cycled). `scrape_ms`: the policies see the experts
    from scrapes that far apart (as `bench qos`'s option), else exactly. `predictor`:
    the folder of the predictor every policy reads (as `bench qos`'s option).
    `settings`: the sweep points measured, by label (`points_named`)."""
    from workers.quality import default_data_dir

    tasks = load_tasks(default_data_dir(), split="eval", quality=quality)
    runs = models or {k: v for k, v in trained_runs(quality).items() if k in ("full", "dsa")}
    read_from = run_predictor(quality, predictor, runs)
    served_predictor = ServedPredictor(load_predictor(read_from))
    seeds = [seed + 100 + i for i in range(1 if quick else 5)]
    drawn = [held_out_hardware(k) if hardware == "held-out" else 0 for k in range(len(seeds))]
    episode = 256 if quick else 512
    chosen = points_named(settings)
    points = chosen[: 1 if quick else None]
    rows: list[dict[str, Any]] = []
    for point in points:
        label, rate, latency_ms = point.label, point.rate, point.latency_ms
        policies: dict[str, Policy] = {"SQF": BASELINES["SQF"]}
        policies.update({k: served(load(v[0], latency_ms)) for k, v in runs.items()})
        for name, policy in policies.items():
            decisions = []
            for s, hw in zip(seeds, drawn, strict=True):
                env = EdgeEnv(
                    engine_experts(QUALITY_MODELS[quality], point.n)
                    if hardware == "engines"
                    else default_experts(
                        point.n, seed=hw, models=QUALITY_MODELS[quality], fleet=fleet
                    ),
                    tasks,
                    rate=rate,
                    latency_req=latency_ms / 1000,
                    episode_len=episode,
                    predictor=served_predictor,
                    reward="qos",  # the penalties are read in `trajectory`, not from `step`
                    impact="hindsight",
                    scrape=None if scrape_ms is None else scrape_ms / 1000,
                )
                decisions += trajectory(env, policy, s)
            harm = [d["true"] for d in decisions]
            later = [d["hindsight"] for d in decisions]
            for kind in ESTIMATORS:
                rows.append(
                    {
                        "setting": label,
                        "trajectory": name,
                        "estimator": f"eq. 15 {kind}",
                        "decisions": len(decisions),
                        "costly": sum(h > 0 for h in harm) / len(harm),
                        "mean_true": statistics.fmean(harm),
                        "costly_hindsight": sum(h > 0 for h in later) / len(later),
                        "mean_hindsight": statistics.fmean(later),
                        "mean_shared": statistics.fmean(d["shared"] for d in decisions),
                        "room": statistics.fmean(d["room"] for d in decisions),
                        "room_share": sum(d["room"] > 0 for d in decisions) / len(decisions),
                        "room_hindsight": statistics.fmean(d["room_hindsight"] for d in decisions),
                        "room_hindsight_share": sum(d["room_hindsight"] > 0 for d in decisions)
                        / len(decisions),
                        **summary(decisions, kind),
                    }
                )
            last = rows[-2:]
            print(
                f"  {label:<10} {name:<6} costly {last[0]['costly']:.1%} "
                f"(hindsight {last[0]['costly_hindsight']:.1%})  "
                + "  ".join(
                    f"{r['estimator']}: fires {r['fires']:.1%} precision {_pct(r['precision'])} "
                    f"recall {_pct(r['recall'])}"
                    for r in last
                ),
                flush=True,
            )
    base, scrape_flag = scrape_named(
        "qos_impact" + quality_suffix(quality) + fleet.suffix(), scrape_ms
    )
    base, hardware_flag = variant_named(base, seed, hardware)
    base, predictor_flag = predictor_named(base, quality, read_from)
    settings_flag = ""
    if settings is not None:
        shown_settings = ",".join(p.label for p in chosen)
        base += "_" + shown_settings.replace(",", "_").replace("=", "-")
        settings_flag = f" --settings {shown_settings}"
    name, model_flags = agents_named(base, models)
    write(
        name,
        {
            "command": "edgeroute bench qos-impact"
            + (" --quick" if quick else "")
            + quality_flag(quality)
            + fleet.flags()
            + scrape_flag
            + hardware_flag
            + predictor_flag
            + settings_flag
            + model_flags,
            "models": {k: recorded(v[0]) for k, v in runs.items()},
            "seeds": seeds,
            "hardware": "live engines" if hardware == "engines" else drawn,
            "episode": episode,
        },
        rows,
        [
            "setting",
            "trajectory",
            "estimator",
            "decisions",
            "costly",
            "fires",
            "precision",
            "recall",
            "mean_true",
            "mean_estimate",
            "costly_hindsight",
            "mean_hindsight",
            "mean_shared",
            "room",
            "room_share",
            "room_hindsight",
            "room_hindsight_share",
        ],
        json_path,
        notes=(
            "Per routed decision along each policy's own trajectory (N as each setting "
            "says, 6 by default; "
            + {
                "seed-0": f"hardware seed 0; {fleet.describe()}",
                "held-out": f"hardware seeds {drawn[0]}-{drawn[-1]}, one per environment "
                f"seed; {fleet.describe()}",
                "engines": "the six engine profiles of `bench qos --live`, N of them cycled",
            }[hardware]
            + (
                ""
                if scrape_ms is None
                else f"; policies see the experts from scrapes {scrape_ms:g} ms apart"
            )
            + "; "
            f"evaluation prompts, environment seeds {seeds[0]}-{seeds[-1]}, {episode} "
            "decisions each). `costly`: share of decisions whose arrival truly costs the "
            "chosen expert's other requests QoS (their future with and without it, nothing "
            "more arriving; true lengths and scores). `fires`: share the estimator "
            "penalises. `precision`: of those, the share that were costly; `recall`: of the "
            "costly ones, the share it penalises. `mean_true`, `mean_estimate`: QoS per "
            "decision. `costly_hindsight`, `mean_hindsight`: the same counted in hindsight, "
            "with the requests routed to that expert while the arrival's request ran "
            "(`EdgeEnv.hindsight_impact`). `mean_shared`: the hindsight impact with each "
            "loss shared among the requests that each caused it (`EdgeEnv.hindsight_charges`). "
            "`room`: per decision, what a router that "
            "knows every expert's future (nothing more arriving) gains in total QoS by "
            "weighing the others' loss over one that maximises the arrival's own QoS "
            "(`EdgeEnv.impact_room`): the most the action-impact term can buy, myopically; "
            "`room_share`: the share of decisions where the two choose apart. "
            "`room_hindsight`, `room_hindsight_share`: the same with the requests the "
            "trajectory routed to each expert while the arrival would have run there "
            "(`EdgeEnv.hindsight_room`; the later routing held as it was). The agents "
            "are each world's run 0."
        ),
        quick=quick,
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"
