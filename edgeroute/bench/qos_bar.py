"""Issue 17's bar read from one `bench qos` run: at each setting, is the agent's 95%
interval apart above every baseline's?

The baselines are the run's heuristics and the agents named as baselines (dsa,
Baseline RL); other agents of the run (variants of the same reward) are not. Each
verdict is taken twice: over the environment seeds, with an agent's training runs
averaged on each (the intervals `bench qos` prints), and counting the training runs
as well (`stats.crossed_interval`), which says whether training the agents again would
keep it. A live run measures one training run per seed, so it has the first only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeroute.bench.qos_paired import LIVE, policy_name
from edgeroute.bench.stats import crossed_interval, interval, verdict
from edgeroute.results_io import table

Interval = tuple[float, float]


class NotJudged(ValueError):
    """An agent or baseline the run does not have."""


def _shown(ci: Interval) -> str:
    return f"{ci[0]:.3f} ± {ci[1]:.3f}"


def _judged(agent: Interval, contenders: dict[str, Interval]) -> tuple[str, bool]:
    """The best contender by its mean, shown, and whether `agent` is apart above all."""
    best = max(contenders, key=lambda k: contenders[k][0])
    apart = all(verdict(agent, ci) == "wins" for ci in contenders.values())
    return f"{best} {_shown(contenders[best])}", apart


def bar_rows(payload: dict[str, Any], agent: str, baselines: Sequence[str]) -> list[dict[str, Any]]:
    """One row per setting: the agent's interval, the best baseline's and whether the
    agent is apart above every baseline, over the seeds and, where the run kept each
    training run's figures, counting the runs. Raises NotJudged for a name the run
    does not have at some setting."""
    at: dict[str, list[dict[str, Any]]] = {}
    for row in payload["results"]:
        at.setdefault(row.get("setting") or LIVE, []).append(row)
    out = []
    for setting, rows in at.items():
        named = {policy_name(r): r for r in rows}
        for name in (agent, *baselines):
            if name not in named:
                raise NotJudged(f"no policy {name!r} at {setting}; the run has {', '.join(named)}")
        # A live run marks no row an agent: there every policy but the named agents is
        # a heuristic.
        agents = set(payload["config"].get("models", {}))
        contenders = [
            r
            for r in rows
            if policy_name(r) in baselines
            or (policy_name(r) not in agents and not r.get("reference") and not r.get("agent"))
        ]
        by_seed = {policy_name(r): interval(r["per_seed_qos"]) for r in contenders}
        mine = interval(named[agent]["per_seed_qos"])
        best, apart = _judged(mine, by_seed)
        line: dict[str, Any] = {
            "setting": setting,
            "agent": _shown(mine),
            "best baseline": best,
            "apart": "yes" if apart else "no",
        }
        if all("per_run_qos" in r for r in (named[agent], *contenders)):
            by_run = {policy_name(r): crossed_interval(r["per_run_qos"]) for r in contenders}
            mine = crossed_interval(named[agent]["per_run_qos"])
            best, apart = _judged(mine, by_run)
            line |= {
                "agent, counting runs": _shown(mine),
                "best baseline, counting runs": best,
                "apart, counting runs": "yes" if apart else "no",
            }
        out.append(line)
    return out


COLUMNS = [
    "setting",
    "agent",
    "best baseline",
    "apart",
    "agent, counting runs",
    "best baseline, counting runs",
    "apart, counting runs",
]


def main(file: Path, agent: str, baselines: Sequence[str], json_path: str | None) -> None:
    payload = json.loads(file.read_text())
    rows = bar_rows(payload, agent, baselines)
    counts = [
        f"{sum(r.get(c) == 'yes' for r in rows)} of {len(rows)} {what}"
        for c, what in (("apart", "over the seeds"), ("apart, counting runs", "counting runs"))
        if any(c in r for r in rows)
    ]
    print(
        f"{payload['benchmark']}: {agent} against the heuristics"
        + "".join(f", {b}" for b in baselines)
        + f" (95% intervals); apart above every one at {' and '.join(counts)}\n"
    )
    print(table(rows, [c for c in COLUMNS if any(c in r for r in rows)]))
    if json_path:
        Path(json_path).write_text(
            json.dumps(
                {
                    "benchmark": payload["benchmark"],
                    "agent": agent,
                    "baselines": list(baselines),
                    "rows": rows,
                },
                indent=1,
            )
        )
