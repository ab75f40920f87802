"""The learning curves drawn from training records: the argmax curve of every run, and
the curve by draws where the record has one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgeroute.qos import card


def record(tmp: Path, name: str, drawn: bool) -> None:
    history = [
        {"step": step, "qos": q, **({"qos_drawn": q + 0.1} if drawn else {})}
        for step, q in ((10_000, 0.2), (20_000, 0.1))
    ]
    run = tmp / name
    run.mkdir(parents=True)
    data = {"config": {"variant": "dsa"}, "history": history, "sqf_eval_qos": 0.2}
    (run / "training.json").write_text(json.dumps(data))


def test_curves_draw_each_run_by_argmax_and_by_draws_where_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(tmp_path / "runs", "new", drawn=True)
    record(tmp_path / "runs", "old", drawn=False)
    figures: list[Any] = []
    monkeypatch.setattr(card, "save_figure", lambda fig, path: figures.append((fig, path)))
    out = card.write_curves(tmp_path / "runs", tmp_path / "curves.png")
    [(fig, path)] = figures
    assert path == out == tmp_path / "curves.png"
    drawn = [line for line in fig.axes[0].lines if len(line.get_xdata())]
    solid = [line.get_ydata().tolist() for line in drawn if line.get_linestyle() == "-"]
    dotted = [line.get_ydata().tolist() for line in drawn if line.get_linestyle() == ":"]
    assert sorted(solid) == [[0.2, 0.1], [0.2, 0.1]]
    assert dotted == [pytest.approx([0.3, 0.2])]  # only the run that recorded it


def test_a_folder_without_records_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no training records"):
        card.write_curves(tmp_path, tmp_path / "curves.png")
