"""Issue 17's bar read from one `bench qos` run: at each setting, is the agent's 95%
interval apart above every baseline's?

The baselines are the run's heuristics and the agents named as baselines (dsa,
Baseline RL); other agents of the run (variants of the same reward) are not. Each
verdict is taken twice: over the environment seeds, with an agent's training runs
averaged on each (the intervals `bench qos` prints), and counting the training runs
as well (`stats.crossed_interval`), which says whether training the agents again would
keep it. A live run measures one training run per seed, so it has the first only.

A live run's figures are also the harness's: when the event loop that runs the
emulated engines falls behind, every policy's requests wait on it and the run measures
the machine, not the routing. Its verdict therefore carries the worst lag the run saw,
and a bound on it (`max_loop_lag_ms`) refuses to judge a run that went over.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeroute.bench.qos_paired import by_setting, policy_name
from edgeroute.results_io import save_figure, table
from edgeroute.stats import crossed_interval, interval, verdict

Interval = tuple[float, float]


class NotJudged(ValueError):
    """An agent or baseline the run does not have, or a live run whose harness lagged
    past the bound."""


@dataclass(frozen=True)
class Judged:
    """One setting judged one way: the agent's interval, the best baseline (by its mean)
    and its interval, whether the agent is apart above every baseline, and for a live
    run the worst p99 of its event loop's lag (emulated ms) over the judged rows."""

    agent: Interval
    best: str
    best_ci: Interval
    apart: bool
    loop_lag_ms: float | None = None


def _judged(
    agent: Interval, contenders: dict[str, Interval], loop_lag_ms: float | None = None
) -> Judged:
    best = max(contenders, key=lambda k: contenders[k][0])
    apart = all(verdict(agent, ci) == "wins" for ci in contenders.values())
    return Judged(agent, best, contenders[best], apart, loop_lag_ms)


def _worst_loop_lag(rows: Sequence[dict[str, Any]]) -> float | None:
    """The highest of the live `rows`' `worst_loop_lag_ms` (each row's worst seed, as
    `bench qos --live` wrote it); None for a simulated run, whose rows have none."""
    return max((r["worst_loop_lag_ms"] for r in rows if "worst_loop_lag_ms" in r), default=None)


def judged(
    payload: dict[str, Any],
    agent: str,
    baselines: Sequence[str],
    max_loop_lag_ms: float | None = None,
) -> dict[str, tuple[Judged, Judged | None]]:
    """Each setting judged over the seeds and, where the run kept each training run's
    figures, counting the runs (else None). Raises NotJudged for a name the run does
    not have at some setting, and for a live setting whose harness lagged past
    `max_loop_lag_ms`."""
    # A live run marks no row an agent: there every policy but the named agents is a
    # heuristic.
    agents = set(payload["config"].get("models", {}))
    out: dict[str, tuple[Judged, Judged | None]] = {}
    for setting, rows in by_setting(payload["results"]).items():
        named = {policy_name(r): r for r in rows}
        for name in (agent, *baselines):
            if name not in named:
                raise NotJudged(f"no policy {name!r} at {setting}; the run has {', '.join(named)}")
        contenders = [
            r
            for r in rows
            if policy_name(r) in baselines
            or (policy_name(r) not in agents and not r.get("reference") and not r.get("agent"))
        ]
        lag = _worst_loop_lag([named[agent], *contenders])
        if max_loop_lag_ms is not None and lag is not None and lag > max_loop_lag_ms:
            raise NotJudged(
                f"the harness lagged at {setting}: its event loop's lag p99 reached "
                f"{lag:.0f} ms, above the bound of {max_loop_lag_ms:g} ms; the run measured "
                "the machine more than the policies (try a lower --speedup)"
            )
        by_seed = _judged(
            interval(named[agent]["per_seed_qos"]),
            {policy_name(r): interval(r["per_seed_qos"]) for r in contenders},
            lag,
        )
        by_run = None
        if all("per_run_qos" in r for r in (named[agent], *contenders)):
            by_run = _judged(
                crossed_interval(named[agent]["per_run_qos"]),
                {policy_name(r): crossed_interval(r["per_run_qos"]) for r in contenders},
            )
        out[setting] = (by_seed, by_run)
    return out


def _shown(ci: Interval) -> str:
    return f"{ci[0]:.3f} ± {ci[1]:.3f}"


def bar_rows(
    payload: dict[str, Any],
    agent: str,
    baselines: Sequence[str],
    max_loop_lag_ms: float | None = None,
) -> list[dict[str, Any]]:
    """`judged` as table rows: the agent's interval, the best baseline's and whether the
    agent is apart above every baseline, over the seeds and counting the runs, and a
    live run's worst loop lag."""
    return _rows(judged(payload, agent, baselines, max_loop_lag_ms))


def _rows(verdicts: dict[str, tuple[Judged, Judged | None]]) -> list[dict[str, Any]]:
    rows = []
    for setting, (by_seed, by_run) in verdicts.items():
        row: dict[str, Any] = {
            "setting": setting,
            "agent": _shown(by_seed.agent),
            "best baseline": f"{by_seed.best} {_shown(by_seed.best_ci)}",
            "apart": "yes" if by_seed.apart else "no",
        }
        if by_seed.loop_lag_ms is not None:
            row["worst loop lag p99 (ms)"] = round(by_seed.loop_lag_ms, 1)
        if by_run is not None:
            row |= {
                "agent, counting runs": _shown(by_run.agent),
                "best baseline, counting runs": f"{by_run.best} {_shown(by_run.best_ci)}",
                "apart, counting runs": "yes" if by_run.apart else "no",
            }
        rows.append(row)
    return rows


def plot(verdicts: dict[str, tuple[Judged, Judged | None]], agent: str, out: Path) -> None:
    """The agent's and the best baseline's intervals at each setting, over the seeds
    (left of each pair) and counting the runs (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, len(verdicts) * 0.9), 4))
    # Each setting: the agent (circles) and the best baseline (squares), over the seeds
    # on the left, counting runs on the right.
    ways = (("over the seeds", -0.15, ("C0", "C1")), ("counting runs", 0.15, ("C2", "C3")))
    for i, both in enumerate(verdicts.values()):
        for (way, dx, colours), j in zip(ways, both, strict=True):
            if j is None:
                continue
            marks = ((j.agent, "o", agent), (j.best_ci, "s", "best baseline"))
            for (ci, fmt, who), side, colour in zip(marks, (-0.04, 0.04), colours, strict=True):
                ax.errorbar(
                    i + dx + side,
                    ci[0],
                    ci[1],
                    fmt=fmt,
                    color=colour,
                    capsize=3,
                    label=f"{who}, {way}" if i == 0 else None,
                )
    ax.set_xticks(
        range(len(verdicts)), [s.split(" (")[0] for s in verdicts], rotation=30, fontsize=8
    )
    ax.set_ylabel("average QoS, 95% interval")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out)
    plt.close(fig)


COLUMNS = [
    "setting",
    "agent",
    "best baseline",
    "apart",
    "agent, counting runs",
    "best baseline, counting runs",
    "apart, counting runs",
    "worst loop lag p99 (ms)",
]


def main(
    file: Path,
    agent: str,
    baselines: Sequence[str],
    json_path: str | None,
    plot_path: Path | None = None,
    max_loop_lag_ms: float | None = None,
) -> None:
    payload = json.loads(file.read_text())
    verdicts = judged(payload, agent, baselines, max_loop_lag_ms)
    rows = _rows(verdicts)
    if plot_path is not None:
        plot(verdicts, agent, plot_path)
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
