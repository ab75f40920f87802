"""What better decisions are worth at a setting: `edgeroute bench qos-rollout`.

An agent's runs against the same runs improved by one rollout step
(`edgeroute.qos.rollout`) on the engines' fleet, seed by seed, at each given lambda
(N = 6, L = 30 ms, environment seeds numbered as `bench qos` numbers them). The rollout
looks ahead with the simulator's physics and the engines' exact state, which the agent
does not have, so it is a reference, not a contender. It improves on its base only as
far as its copies value what matters: greedy (`--own`) or over a window that ends (every
request of a copy), it can do worse than the agent (docs/research.md, (150)-(154)).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from edgeroute.bench.qos import Sweep, agents_named, scrape_named
from edgeroute.qos.config import DEFAULT_LATENCY_MS, quality_suffix
from edgeroute.qos.evaluate import Policy, evaluate, served
from edgeroute.qos.rollout import Lookahead, rollout
from edgeroute.results_io import recorded, write
from edgeroute.sim.edge import Quality
from edgeroute.stats import paired, shown
from policies.qos_drl import load

COLUMNS = ["rate", "policy", "qos_ci", "paired_minus_base"]


def lookahead_named(base: str, lookahead: Lookahead) -> tuple[str, str]:
    """The results' name and flags for a lookahead other than the default."""
    default, flags = Lookahead(), ""
    if lookahead.horizon != default.horizon:
        flags += f" --horizon {lookahead.horizon}"
    if lookahead.futures != default.futures:
        flags += f" --futures {lookahead.futures}"
    if not lookahead.believed:
        flags += " --truth"
    if lookahead.own:
        flags += " --own"
    suffix = flags.replace(" --", "_").replace(" ", "-")
    return base + suffix, flags


def main(
    quick: bool,
    seed: int,
    n_seeds: int,
    json_path: str | None,
    models: dict[str, list[Path]],
    rates: list[float],
    lookahead: Lookahead,
    quality: Quality = "routerdc",
    scrape_ms: float | None = None,
) -> None:
    """Each agent in `models` (its runs' figures averaged on each seed) and its rollout,
    at each of `rates`, on environment seeds `seed` + 100 onwards, episodes of 512
    decisions (`quick`: 128, and the files go to a temporary folder)."""
    from workers.quality import default_data_dir

    seeds = [seed + 100 + i for i in range(n_seeds)]
    sweep = Sweep.of(
        quality,
        default_data_dir(),
        hardware="engines",
        episode=128 if quick else 512,
        scrape_ms=scrape_ms,
    )
    agents = {
        name: [served(load(d, DEFAULT_LATENCY_MS)) for d in dirs] for name, dirs in models.items()
    }
    rows: list[dict[str, Any]] = []
    for rate in rates:
        for name, runs in agents.items():
            policies: dict[str, list[Policy]] = {
                name: runs,
                f"rollout({name})": [rollout(r, lookahead) for r in runs],
            }
            figures: dict[str, list[float]] = {k: [] for k in policies}
            for k, one_seed in enumerate(seeds):
                for label, policy_runs in policies.items():
                    figures[label].append(
                        statistics.fmean(
                            evaluate(sweep.env(k, rate=rate), p, [one_seed]).qos
                            for p in policy_runs
                        )
                    )
                print(
                    f"  lambda={rate:g} seed {one_seed}: "
                    + ", ".join(f"{label} {v[-1]:.3f}" for label, v in figures.items()),
                    flush=True,
                )
            base = figures[name]
            for label, qos in figures.items():
                rows.append(
                    {
                        "rate": rate,
                        "policy": label,
                        "qos_ci": shown(qos),
                        "paired_minus_base": "" if label == name else paired(qos, base),
                        "per_seed_qos": qos,
                    }
                )
    base_name, scrape_flag = scrape_named("qos_rollout" + quality_suffix(quality), scrape_ms)
    rates_part = "-".join(f"{r:g}" for r in rates)
    named, look_flags = lookahead_named(
        f"{base_name}_lambda-{rates_part}_seed-{seed}_seeds-{n_seeds}", lookahead
    )
    name, model_flags = agents_named(named, models, {})
    config = {
        "command": f"edgeroute bench qos-rollout --quality {quality}{scrape_flag} "
        f"--rates {','.join(f'{r:g}' for r in rates)} --seed {seed} --seeds {n_seeds}"
        f"{look_flags}{model_flags}",
        "quality": quality,
        "seeds": seeds,
        "rates": rates,
        "scrape_ms": scrape_ms,
        "lookahead": asdict(lookahead),
        "models": {k: [recorded(d) for d in v] for k, v in models.items()},
    }
    write(
        name,
        config,
        rows,
        COLUMNS,
        json_path,
        quick=quick,
        notes=(
            "On the live run's engines (N = 6, L = 30 ms): each agent (its runs averaged "
            "on each seed) and the same runs improved by one rollout step, which tries "
            "every engine in copies of the episode run on by the agent for `horizon` "
            "decisions, their arrivals drawn afresh; with the requests' predicted lengths "
            "and scores unless `--truth`. `paired_minus_base`: the rollout less its "
            "agent, seed by seed. A reference that reads the engines' exact state and "
            "the simulator's physics, not a contender."
        ),
    )
