"""Paired differences between policies of one `bench qos` run, setting by setting.

Every policy of a QoS run (simulated or live) was measured on the same environment
seeds, so the difference of two policies seed by seed is a sharper test than their
two intervals side by side. `bench qos` gives it for the first agent against the
others; this reads any run's results file and gives it for any pairs, so the paired
tables in docs/research.md come from a command rather than by hand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeroute.results_io import table
from edgeroute.stats import crossed_paired_interval, paired_interval

_RUNS = re.compile(r" \(\d+ seeds\)$")  # `bench qos` names an agent of k runs "name (k seeds)"
LIVE = "live"  # the setting of a live run's rows, which name none


class NotPaired(ValueError):
    """A pair that the run cannot give."""


def policy_name(row: dict[str, Any]) -> str:
    """A row's policy as `--model` named it."""
    return _RUNS.sub("", row["policy"])


def settings(
    results: Sequence[dict[str, Any]], field: str = "per_seed_qos"
) -> dict[str, dict[str, Any]]:
    """Each setting's policies' `field` (QoS per environment seed, or per training run
    and seed), in the run's order."""
    out: dict[str, dict[str, Any]] = {}
    for setting, rows in by_setting(results).items():
        for row in rows:
            if field not in row:
                raise NotPaired(
                    f"{policy_name(row)} has no {field}: only a simulated `bench qos` run "
                    "keeps each training run's figures (a live run measures one run per seed)"
                )
            out.setdefault(setting, {})[policy_name(row)] = row[field]
    return out


def by_setting(results: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A run's rows by setting, in the run's order (a live run's under `LIVE`)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in results:
        out.setdefault(row.get("setting") or LIVE, []).append(row)
    return out


def default_pairs(payload: dict[str, Any]) -> list[tuple[str, str]]:
    """The first agent against each other agent, as `bench qos` pairs them."""
    agents = list(payload["config"].get("models", {}))
    return [(agents[0], other) for other in agents[1:]]


def paired_rows(
    payload: dict[str, Any], pairs: Sequence[tuple[str, str]], runs: bool = False
) -> list[dict[str, Any]]:
    """One row per setting: each pair's mean difference seed by seed with its 95%
    interval, how many seeds the first was above on, and whether the interval is
    `above` 0, `below` it or holds it (`tie`); with `runs`, the interval counts the
    training runs too and the seeds above are left out. Raises NotPaired for a name
    the run does not have, pairs of unequal seeds, or `runs` on a run without them."""
    if not pairs:
        raise NotPaired("no pairs: the run has fewer than two agents; name them with --pair")
    rows = []
    figures = settings(payload["results"], "per_run_qos" if runs else "per_seed_qos")
    for setting, qos in figures.items():
        row: dict[str, Any] = {"setting": setting}
        for a, b in pairs:
            for name in (a, b):
                if name not in qos:
                    raise NotPaired(
                        f"no policy {name!r} at {setting}; the run has {', '.join(qos)}"
                    )
            if runs:
                if len(qos[a][0]) != len(qos[b][0]):
                    raise NotPaired(f"{a} and {b} have different seeds at {setting}")
                mean, half = crossed_paired_interval(qos[a], qos[b])
                row[f"{a} - {b}"] = f"{mean:+.3f} ± {half:.3f} {_apart(mean, half)}"
                continue
            if len(qos[a]) != len(qos[b]):
                raise NotPaired(f"{a} and {b} have different seeds at {setting}")
            mean, half, above = paired_interval(qos[a], qos[b])
            row[f"{a} - {b}"] = (
                f"{mean:+.3f} ± {half:.3f} ({above} of {len(qos[a])}) {_apart(mean, half)}"
            )
        rows.append(row)
    return rows


def _apart(mean: float, half: float) -> str:
    """`above` or `below` when the interval of the difference excludes 0, else `tie`."""
    if mean - half > 0:
        return "above"
    if mean + half < 0:
        return "below"
    return "tie"


def main(
    file: Path, pairs: Sequence[tuple[str, str]], json_path: str | None, runs: bool = False
) -> None:
    payload = json.loads(file.read_text())
    pairs = list(pairs) or default_pairs(payload)
    rows = paired_rows(payload, pairs, runs)
    columns = ["setting", *(f"{a} - {b}" for a, b in pairs)]
    counted = (
        "mean ± 95% half-width counting the training runs"
        if runs
        else "mean ± 95% half-width, seeds above"
    )
    print(
        f"{payload['benchmark']}: paired over seeds {payload['config']['seeds'][0]}-"
        f"{payload['config']['seeds'][-1]} ({counted})\n"
    )
    print(table(rows, columns))
    if json_path:
        Path(json_path).write_text(
            json.dumps(
                {"benchmark": payload["benchmark"], "pairs": pairs, "runs": runs, "rows": rows},
                indent=1,
            )
        )
