"""A rebuilt run is the committed run only when its weights, config and every argmax
evaluation are equal; only then is the committed record replaced, and never its actor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeroute.qos import rebuild
from edgeroute.qos.config import read_record

WEIGHTS = np.array([[0.25, -1.5], [3.0, 0.125]], np.float32)


def write_run(
    run: Path,
    weights: np.ndarray = WEIGHTS,
    qos: tuple[float, ...] = (0.31, 0.42),
    seconds: float = 600.0,
    drawn: bool = False,
    **record: Any,
) -> Path:
    """A run folder: a one-node actor graph holding `weights`, and its record."""
    run.mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "actor",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(weights, "w")],
    )
    onnx.save(helper.make_model(graph), str(run / "actor.onnx"))
    history = [
        {"step": 10_000 * (i + 1), "seconds": seconds * (i + 1), "qos": q, "loss_q": 0.1}
        | ({"qos_drawn": q - 0.01} if drawn else {})
        for i, q in enumerate(qos)
    ]
    data = {
        "commit": "aaaaaaa",
        "config": {"variant": "full", "seed": 1, "steps": 20_000},
        "best_eval_qos": max(qos),
        "history": history,
        **record,
    }
    (run / "training.json").write_text(json.dumps(data, indent=1) + "\n")
    return run


def test_a_rebuild_of_the_same_run_replaces_the_record_and_keeps_the_actor(tmp_path: Path) -> None:
    committed = write_run(tmp_path / "runs" / "full-s1", reexport_note="re-exported")
    actor = (committed / "actor.onnx").read_bytes()
    now = {"variant": "full", "seed": 1, "steps": 20_000, "buffer": 50_000}  # a setting added
    rebuilt = write_run(
        tmp_path / "rebuilt" / "full-s1",
        seconds=450.0,  # another machine's timing
        drawn=True,
        commit="bbbbbbb",
        config=now,
    )
    found = rebuild.adopt(committed, rebuilt)
    assert found.same and found.best == (0.42, 0.42)
    record = json.loads((committed / "training.json").read_text())
    assert record["commit"] == "bbbbbbb" and record["first_trained_at"] == "aaaaaaa"
    assert "first trained at aaaaaaa" in record["rebuild_note"]
    assert record["reexport_note"] == "re-exported"
    assert [h["qos_drawn"] for h in record["history"]] == pytest.approx([0.30, 0.41])
    assert (committed / "actor.onnx").read_bytes() == actor
    # Adopted again (a later rebuild), it still names the first training.
    again = write_run(tmp_path / "again" / "full-s1", drawn=True, commit="ccccccc", config=now)
    assert rebuild.adopt(committed, again).same
    assert json.loads((committed / "training.json").read_text())["first_trained_at"] == "aaaaaaa"


@pytest.mark.parametrize(
    ("change", "failing"),
    [
        ({"weights": WEIGHTS + np.float32(2**-20)}, "weights"),  # one bit in the mantissa
        ({"qos": (0.31, 0.4200001)}, "history"),
        ({"qos": (0.31,)}, "history"),  # an evaluation short
        ({"config": {"variant": "full", "seed": 2, "steps": 20_000}}, "config"),
        ({"config": {"variant": "full", "seed": 1}}, "config"),  # a setting missing
    ],
)
def test_any_difference_is_another_run_and_nothing_is_written(
    tmp_path: Path, change: dict[str, Any], failing: str
) -> None:
    committed = write_run(tmp_path / "committed")
    before = (committed / "training.json").read_text()
    found = rebuild.adopt(committed, write_run(tmp_path / "rebuilt", drawn=True, **change))
    assert not found.same
    assert {"weights": found.weights, "history": found.history, "config": found.config} == {
        k: k != failing for k in ("weights", "history", "config")
    }
    assert (committed / "training.json").read_text() == before


def test_folders_pair_runs_by_name_and_refuse_a_missing_rebuild(tmp_path: Path) -> None:
    for name in ("dsa-s0", "full-s0"):
        write_run(tmp_path / "runs" / name)
    write_run(tmp_path / "rebuilt" / "full-s0")
    with pytest.raises(SystemExit, match=r"no rebuild in .* of: dsa-s0"):
        rebuild.run_pairs(tmp_path / "runs", tmp_path / "rebuilt")
    write_run(tmp_path / "rebuilt" / "dsa-s0")
    pairs = rebuild.run_pairs(tmp_path / "runs", tmp_path / "rebuilt")
    assert [name for name, _, _ in pairs] == ["dsa-s0", "full-s0"]
    with pytest.raises(SystemExit, match="no training records"):
        rebuild.run_pairs(tmp_path / "empty", tmp_path / "rebuilt")


def test_the_command_says_which_runs_differ_and_exits_1(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "dsa-s0")
    write_run(tmp_path / "runs" / "full-s0")
    write_run(tmp_path / "rebuilt" / "dsa-s0", drawn=True)
    write_run(tmp_path / "rebuilt" / "full-s0", qos=(0.31, 0.43), drawn=True)

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "edgeroute.cli", "train", "qos-rebuilt", *extra],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ),
        )

    r = run(str(tmp_path / "runs"), str(tmp_path / "rebuilt"), "--adopt")
    assert r.returncode == 1, r.stderr
    dsa, full, hint = r.stdout.strip().splitlines()
    assert dsa.startswith("dsa-s0: the same run") and dsa.endswith("replaced by the rebuild's")
    assert full.startswith("full-s0: another run") and "evaluations equal: False" in full
    # Neither record names its processor, so the difference may be the processor's.
    assert hint.strip().startswith("trained on not recorded, rebuilt on not recorded")
    assert "qos_drawn" in (tmp_path / "runs" / "dsa-s0" / "training.json").read_text()
    assert "qos_drawn" not in (tmp_path / "runs" / "full-s0" / "training.json").read_text()
    r = run(str(tmp_path / "runs" / "dsa-s0"), str(tmp_path / "rebuilt" / "dsa-s0"))
    assert r.returncode == 0 and r.stdout.startswith("dsa-s0: the same run"), r.stderr


XEON = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_capability": "AVX512"}
EPYC = {"cpu": "AMD EPYC 7B13", "cpu_capability": "AVX2"}


def test_a_comparison_names_each_runs_processor(tmp_path: Path) -> None:
    old = write_run(tmp_path / "old", machine=EPYC)
    assert rebuild.processor(read_record(old)) == "AMD EPYC 7B13, AVX2"
    across = rebuild.compare(old, write_run(tmp_path / "xeon", qos=(0.3, 0.4), machine=XEON))
    assert not across.same and across.same_processor is False
    assert across.processors == ("AMD EPYC 7B13, AVX2", "Intel(R) Xeon(R) Processor, AVX512")
    alike = rebuild.compare(old, write_run(tmp_path / "epyc", machine=EPYC))
    assert alike.same and alike.same_processor is True
    unknown = rebuild.compare(write_run(tmp_path / "before"), old)
    assert unknown.processors == (None, "AMD EPYC 7B13, AVX2") and unknown.same_processor is None
