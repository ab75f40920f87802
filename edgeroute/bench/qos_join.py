"""Two simulated `bench qos` runs of one world on the same seeds, joined into the run
that would have measured all their agents at once.

An agent's rows depend on its own runs and the world alone (each episode is built
from the environment seed), so agents measured in separate processes side by side, or
a new agent beside a committed file, can be judged together: the joined file is named,
and its command written, as the single run of every agent would be, and its verdicts
(`bench qos`'s `judge`) are taken again over all the agents, the first file's first
agent first. `bench qos-bar` and `bench qos-paired` then read one file.

Refused: runs of another world (the command before its agents differs), on other
seeds, of other settings, an agent in both, and any policy both measured that came out
differently: the heuristics, run twice, must agree to the last digit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeroute.bench.qos import COLUMNS, agents_named, judge, plot
from edgeroute.results_io import output_dir, write

# The verdicts `judge` sets, taken again over the joined agents.
VERDICTS = (
    "against_best",
    "against_best_runs",
    "against_agents",
    "against_agents_runs",
    "paired_minus_agents",
    "paired_minus_agents_runs",
)


class NotJoinable(ValueError):
    """The runs are not of one world on the same seeds."""


def world(command: str) -> str:
    """A run's command without its agents (`bench qos` writes them last)."""
    return command.split(" --model ", 1)[0]


def agent_names(run: dict[str, Any]) -> str:
    """The end of a run's name that its agents give it (`qos.agents_named`)."""
    models = run["config"]["models"]
    name: str = run["benchmark"]
    suffix, _ = agents_named("", {k: [] for k in models})
    if not models or not name.endswith(suffix):
        raise NotJoinable(f"{name}: not a run of agents given with --model")
    return suffix


def joined(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """The run of both runs' agents: its name, config and rows, verdicts taken anew."""
    a, b = first["config"], second["config"]
    agent_names(first)
    suffix = agent_names(second)
    if world(a["command"]) != world(b["command"]):
        raise NotJoinable(f"other worlds: {world(a['command'])!r} against {world(b['command'])!r}")
    if a["seeds"] != b["seeds"]:
        raise NotJoinable("other environment seeds")
    if both := sorted(set(a["models"]) & set(b["models"])):
        raise NotJoinable(f"an agent in both runs: {', '.join(both)}")
    settings = list(dict.fromkeys(r["setting"] for r in first["results"]))
    if settings != list(dict.fromkeys(r["setting"] for r in second["results"])):
        raise NotJoinable("other settings")
    measured = {(r["setting"], r["policy"]): r for r in first["results"]}
    for r in second["results"]:
        if r["agent"]:
            continue
        twin = measured.get((r["setting"], r["policy"]))
        if twin is None or twin["per_run_qos"] != r["per_run_qos"]:
            raise NotJoinable(
                f"{r['policy']} at {r['setting']} came out differently in the two runs"
            )
    rows: list[dict[str, Any]] = []
    for setting in settings:
        here = [
            {k: v for k, v in r.items() if k not in VERDICTS}
            for run in (first, second)
            for r in run["results"]
            if r["setting"] == setting and (r["agent"] or run is first)
        ]
        judge(here)
        rows += here
    return {
        "benchmark": first["benchmark"] + suffix,
        "config": {
            "command": a["command"] + b["command"][len(world(b["command"])) :],
            "models": {**a["models"], **b["models"]},
            "seeds": a["seeds"],
            "joined_from": [first["benchmark"], second["benchmark"]],
        },
        "results": rows,
    }


def main(first: Path, second: Path, json_path: str | None) -> None:
    runs = [json.loads(p.read_text()) for p in (first, second)]
    out = joined(*runs)
    write(
        out["benchmark"],
        out["config"],
        out["results"],
        COLUMNS,
        json_path,
        notes=(
            f"Joined by `edgeroute bench qos-join {first} {second}`: two runs of one world "
            "on the same seeds, every policy both measured equal in both; the verdicts "
            "are taken over all the agents, the first run's first agent first. The "
            "world, the seeds and how each figure is made are as the two runs' own "
            f"files say (`{runs[0]['benchmark']}.md`)."
        ),
    )
    plot(out["results"], output_dir(False) / f"{out['benchmark']}.png")
