"""`edgeroute train qos-rebuilt`: whether a run trained again is the committed run.

Issue 17 asks that `train qos` at the current commit rebuild the committed model. A
run is the same run when its actor's weights equal the committed actor's, its config
equals the record's, and every argmax evaluation equals the record's to the last
digit. Then the committed record may be replaced by the rebuild's, which can carry what
the code measures now (the evaluation by draws, `qos_drawn`); the committed actor stays.

That equality holds only on the kind of processor that trained the run: another one's
kernels round the first steps' sums differently in the last digit, and SAC carries the
difference into another run (docs/research.md, (199)). Records name their processor
(`train.training_machine`, since 2026-12-05); across processors a rebuild is judged by
its metrics, inside the runs' intervals (`bench qos`), not by its weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from edgeroute.qos.config import RECORD, read_record, recorded_runs, write_record

# What a rebuild may differ in and still be the same run: its timing, and the curve
# by draws that the first training did not measure.
_NOT_COMPARED = frozenset({"seconds", "qos_drawn"})
# What the committed record says of its actor file, which the rebuild keeps.
_ACTOR_FIELDS = ("reexport_note", "reexport_parity_max_abs", "reexport_same_action")


@dataclass(frozen=True)
class Comparison:
    """A committed run against its rebuild."""

    weights: bool  # every initializer of the two actor graphs equal, bit for bit
    history: bool  # every evaluation equal but for its timing and its draws
    config: bool  # every setting the committed record names equal in the rebuild's
    best: tuple[float, float]  # best evaluation: committed, rebuilt
    processors: tuple[str | None, str | None] = (None, None)  # `processor`: committed, rebuilt

    @property
    def same(self) -> bool:
        return self.weights and self.history and self.config

    @property
    def same_processor(self) -> bool | None:
        """Whether both runs were trained on one kind of processor; None when a record
        does not say."""
        old, new = self.processors
        return None if old is None or new is None else old == new


def processor(record: dict[str, Any]) -> str | None:
    """The processor a record's run was trained on and the instructions its kernels
    used ("Intel(R) Xeon(R) Processor, AVX512"), or None for a record from before
    records named it."""
    found = record.get("machine")
    if not found:
        return None
    return f"{found['cpu']}, {found.get('cpu_capability', 'instructions not recorded')}"


def _weights(actor: Path) -> dict[str, np.ndarray]:
    graph = onnx.load(str(actor)).graph
    return {i.name: numpy_helper.to_array(i) for i in graph.initializer}


def _evaluations(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in h.items() if k not in _NOT_COMPARED} for h in record["history"]]


def compare(committed: Path, rebuilt: Path) -> Comparison:
    """Two run folders (each with actor.onnx and training.json)."""
    a, b = _weights(committed / "actor.onnx"), _weights(rebuilt / "actor.onnx")
    old, new = read_record(committed), read_record(rebuilt)
    # Settings added since the first training are in the rebuild's config only; a
    # rebuild run with their defaults trains as the first did.
    config = all(new["config"].get(k, object()) == v for k, v in old["config"].items())
    return Comparison(
        weights=a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a),
        history=_evaluations(old) == _evaluations(new),
        config=config,
        best=(old["best_eval_qos"], new["best_eval_qos"]),
        processors=(processor(old), processor(new)),
    )


def run_pairs(committed: Path, rebuilt: Path) -> list[tuple[str, Path, Path]]:
    """(name, committed run, rebuilt run): the two folders themselves if they are runs,
    else their runs of the same names; a committed run without a rebuild is refused."""
    if (committed / RECORD).exists():
        return [(committed.name, committed, rebuilt)]
    names = [run.name for run in recorded_runs(committed)]
    if not names:
        raise SystemExit(f"no training records in {committed}")
    missing = [n for n in names if not (rebuilt / n / RECORD).exists()]
    if missing:
        raise SystemExit(f"no rebuild in {rebuilt} of: {', '.join(missing)}")
    return [(n, committed / n, rebuilt / n) for n in names]


def adopt(committed: Path, rebuilt: Path) -> Comparison:
    """Replace the committed record by the rebuild's if the rebuild is the same run,
    naming the commit it was first trained at; the committed actor.onnx is kept.
    Returns the comparison; nothing is written unless it is the same run."""
    found = compare(committed, rebuilt)
    if not found.same:
        return found
    old, new = read_record(committed), read_record(rebuilt)
    first = old.get("first_trained_at", old["commit"])
    new["first_trained_at"] = first
    new["rebuild_note"] = (
        f"rebuilt at {new['commit']} with this config: every evaluation and every actor "
        f"weight equal to the run first trained at {first} (whose actor.onnx is kept); "
        "this record is the rebuild's"
    )
    new.update({k: old[k] for k in _ACTOR_FIELDS if k in old})
    write_record(committed, new)
    return found
