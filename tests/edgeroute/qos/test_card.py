"""The learning curves drawn from training records: the argmax curve of every run, and
the curve by draws where the record has one."""

from __future__ import annotations

import json
import re
import shlex
import statistics
from pathlib import Path
from typing import Any

import pytest

from edgeroute.cli import build_parser, train_config
from edgeroute.qos import card
from edgeroute.qos.config import TrainConfig, read_record, recorded_runs
from policies.predictor import DEFAULT_MODEL_DIR, MODEL_ROOT


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
    out = card.write_curves([tmp_path / "runs"], tmp_path / "curves.png")
    [(fig, path)] = figures
    assert path == out == tmp_path / "curves.png"
    drawn = [line for line in fig.axes[0].lines if len(line.get_xdata())]
    solid = [line.get_ydata().tolist() for line in drawn if line.get_linestyle() == "-"]
    dotted = [line.get_ydata().tolist() for line in drawn if line.get_linestyle() == ":"]
    assert sorted(solid) == [[0.2, 0.1], [0.2, 0.1]]
    assert dotted == [pytest.approx([0.3, 0.2])]  # only the run that recorded it
    # the legend names the variants drawn (both runs are dsa), not every variant there is
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["by draws (solid: argmax)", "SQF", "dsa"]


def test_curves_take_runs_one_by_one_and_folders_of_runs_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(tmp_path / "a", "r1", drawn=False)
    record(tmp_path / "a", "r2", drawn=False)
    record(tmp_path / "b", "r3", drawn=False)
    drawn: list[list[str]] = []
    monkeypatch.setattr(card, "plot_curves", lambda runs, out: drawn.append(sorted(runs)))
    card.write_curves([tmp_path / "a", tmp_path / "b" / "r3"], tmp_path / "curves.png")
    assert drawn == [["r1", "r2", "r3"]]


def test_a_folder_without_records_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no training records"):
        card.write_curves([tmp_path], tmp_path / "curves.png")
    record(tmp_path, "r1", drawn=False)
    with pytest.raises(SystemExit, match=r"no training records in .*empty"):
        card.write_curves([tmp_path, tmp_path / "empty"], tmp_path / "curves.png")


def test_two_runs_of_one_name_are_refused_rather_than_one_lost(tmp_path: Path) -> None:
    record(tmp_path / "a", "full-s0", drawn=False)
    record(tmp_path / "b", "full-s0", drawn=False)
    with pytest.raises(SystemExit, match="two runs named full-s0"):
        card.write_curves([tmp_path / "a", tmp_path / "b"], tmp_path / "curves.png")


def test_several_runs_need_a_name_for_their_plot(tmp_path: Path) -> None:
    from edgeroute.cli import main

    record(tmp_path, "r1", drawn=False)
    record(tmp_path, "r2", drawn=False)
    with pytest.raises(SystemExit, match="several runs need --name"):
        main(["train", "qos-curves", str(tmp_path / "r1"), str(tmp_path / "r2")])


def run_record(qos: list[float], drawn: list[float] | None, **extra: Any) -> dict[str, Any]:
    history = [
        {"step": 10_000 * (i + 1), "qos": q, **({"qos_drawn": drawn[i]} if drawn else {})}
        for i, q in enumerate(qos)
    ]
    return {
        "history": history,
        "seconds": 600.0,
        "steps_per_second": 250.0,
        "best_eval_qos": max(qos),
        "sqf_eval_qos": 0.38,
        "onnx_parity_max_abs": 1e-5,
        **extra,
    }


def test_the_runs_table_measures_both_curves_ends_where_recorded() -> None:
    # Six evaluations: thirds of two. The argmax dips in the last third, the draws do not.
    argmax = [0.3, 0.3, 0.4, 0.4, 0.1, 0.2]
    drawn = [0.3, 0.3, 0.35, 0.35, 0.36, 0.34]
    lines = card.runs_table(
        {"dsa-s1": run_record(argmax, drawn), "dsa-s0": run_record(argmax, None)}
    )
    header, rule, new, old = lines
    assert header.count("|") == rule.count("|") == new.count("|") == old.count("|")
    cells = [c.strip() for c in new.split("|")[1:-1]]
    assert cells[0] == "dsa-s1" and cells[1] == "60000" and cells[4] == "0.400"
    assert cells[5] == "best, step 30000: 0.400"  # the first evaluation at the best
    assert cells[7:9] == ["-0.250", "+0.000"]  # (0.1+0.2)/2 - 0.4, and 0.35 - 0.35
    assert [c.strip() for c in old.split("|")[8:10]] == ["-0.250", "not measured"]


def test_the_runs_table_names_a_last_actor_as_kept() -> None:
    last = run_record([0.3, 0.4, 0.2], None, kept="last", kept_step=30_000, kept_eval_qos=0.2)
    [_, _, row] = card.runs_table({"full-s0": last})
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[4:6] == ["0.400", "last, step 30000: 0.200"]
    assert card.kept(last) == ("last", 30_000, 0.2)
    # a best the history does not hold (a record rewritten since) is named without a step
    unheld = {**run_record([0.3, 0.4], None), "best_eval_qos": 0.45}
    assert card.kept(unheld) == ("best", None, 0.45)
    assert "| best: 0.450 |" in card.runs_table({"full-s0": unheld})[2]


def test_rebuilt_runs_name_both_commits() -> None:
    first = {"a": run_record([0.3], None, commit="fd92371")}
    assert card.trained_at(first) == "- Trained at commit `fd92371`; exported as trained"
    rebuilt = {
        name: run_record([0.3], [0.3], commit="ec3a616", first_trained_at="fd92371")
        for name in ("a", "b")
    }
    line = card.trained_at(rebuilt)
    assert line.startswith(
        "- Trained at commit `fd92371`; exported as trained. Rebuilt at `ec3a616`:"
    )
    # Some runs rebuilt, others not: the rebuilt ones are named.
    rebuilt["c"] = run_record([0.3], None, commit="fd92371")
    line = card.trained_at(rebuilt)
    assert line.startswith(
        "- Trained at commit `fd92371`; exported as trained. Rebuilt at `ec3a616` (a, b):"
    )


def test_the_rebuild_section_names_each_runs_processor_and_judges_the_rebuilds(
    tmp_path: Path,
) -> None:
    from tests.edgeroute.qos.test_rebuild import EPYC, XEON, write_run

    write_run(tmp_path / "runs" / "full-s0", machine=EPYC)
    write_run(tmp_path / "runs" / "full-s1", machine=EPYC)
    write_run(tmp_path / "runs" / "dsa-s0")
    write_run(tmp_path / "rebuild" / "full-s0", qos=(0.31, 0.41), machine=XEON, commit="bbbbbbb")
    write_run(tmp_path / "rebuild" / "full-s1", machine=EPYC)
    write_run(tmp_path / "rebuild" / "other-s0")  # no committed run of that name: left out
    runs = card.runs_of(tmp_path / "runs")
    text = "\n".join(card.rebuild_section(tmp_path, runs))
    assert "- Processor AMD EPYC 7B13, AVX2: full-s0, full-s1." in text
    assert f"- Processor {card.NOT_RECORDED}: dsa-s0." in text
    rows = [line for line in text.splitlines() if line.startswith("| full-s")]
    assert rows == [
        "| full-s0 | `bbbbbbb` | Intel(R) Xeon(R) Processor, AVX512 | no | 0.4200 / 0.4100 |",
        "| full-s1 | `aaaaaaa` | AMD EPYC 7B13, AVX2 | yes | 0.4200 / 0.4200 |",
    ]
    assert "other-s0" not in text
    # Without rebuilds, no table.
    assert "| run |" not in "\n".join(card.rebuild_section(tmp_path / "runs", runs))


@pytest.mark.parametrize(
    "folder",
    [MODEL_ROOT, MODEL_ROOT / "routerdc", MODEL_ROOT / "routerdc" / "engines", DEFAULT_MODEL_DIR],
)
def test_a_card_names_the_command_that_trained_each_run_and_the_actor_it_ships(
    folder: Path,
) -> None:
    """Every committed card: its command, with a run's variant and seed, is that run's
    recorded config through `train qos`; the actor beside the card is the named run's."""
    import onnx

    text = (folder / "MODEL_CARD.md").read_text()
    commands = re.findall(r"- Each run[^`]*: `edgeroute (train qos [^`]*)`", text)
    shipped = re.search(r"`actor.onnx`: the actor of `runs/([^`]+)`", text)
    assert commands and shipped
    runs = recorded_runs(folder / "runs")
    assert len(runs) >= 9
    for run in runs:
        config = read_record(run)["config"]
        variant, seed = config["variant"], config["seed"]
        rebuilt = [
            train_config(
                build_parser().parse_args(
                    shlex.split(
                        command.replace("--variant V", f"--variant {variant}")
                        .replace("--seed S", f"--seed {seed}")
                        .replace("V-sS", run.name)
                    )
                )
            )
            for command in commands
        ]
        assert TrainConfig.from_record(config) in rebuilt, run
    # the served graph, nodes and weights (the older worlds' files differ from their
    # runs' in parameters kept for read-back that the graph does not use)
    actor = onnx.load(str(folder / "runs" / shipped[1] / "actor.onnx")).graph
    assert onnx.load(str(folder / "actor.onnx")).graph == actor


def test_the_simulation_table_judges_each_agent_over_the_seeds_and_counting_runs(
    tmp_path: Path,
) -> None:
    """Two runs that agree seed by seed but not with each other: averaged on each seed
    they beat the heuristic; counting the runs they tie with it. A file without each
    run's figures leaves the second verdict blank."""
    seeds = [0.40, 0.41, 0.42, 0.41, 0.40, 0.42]
    runs = [[q + 0.05 for q in seeds], [q - 0.03 for q in seeds]]
    agent_seeds = [statistics.fmean(s) for s in zip(*runs, strict=True)]
    heuristic = [0.38, 0.385, 0.39, 0.38, 0.385, 0.39]
    rows = [
        {"setting": "default", "policy": "SQF", "qos": 0.385, "qos_ci": "0.385 ± 0.005",
         "per_seed_qos": heuristic},
        {"setting": "default", "policy": "full (2 seeds)", "agent": True, "qos": 0.42,
         "qos_ci": "0.42", "per_seed_qos": agent_seeds, "per_run_qos": runs,
         "against_best": "wins"},
        {"setting": "N=3", "policy": "SQF", "qos": 0.385, "qos_ci": "0.385",
         "per_seed_qos": heuristic},
        {"setting": "N=3", "policy": "full (2 seeds)", "agent": True, "qos": 0.42,
         "qos_ci": "0.42", "per_seed_qos": agent_seeds, "against_best": "wins"},
    ]  # fmt: skip
    path = tmp_path / "qos.json"
    path.write_text(json.dumps({"results": rows}))
    table = [line for line in card._sim_section(path, "test") if line.startswith("| ")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table[1:]]
    assert cells[0][5] == "wins" and cells[0][7] == "tie"
    assert cells[1][5] == "wins" and cells[1][6:] == ["", ""]


def test_a_live_section_names_its_setting(tmp_path: Path) -> None:
    row = {"policy": "RR", "qos_ci": "0.1 ± 0.01", "met_share_ci": "0.3", "drop_rate": 0.0}
    config = {"engines": 6, "rate": 8.0, "latency_ms": 30.0, "seeds": [3911, 3912, 3920]}
    path = tmp_path / "live.json"
    path.write_text(json.dumps({"config": config, "results": [{**row, "requests": 10}]}))
    lines = card._live_section(path, "a run")
    assert "Setting: N = 6, lambda = 8, L (ms) = 30; seeds 3911-3920." in lines
    # a file from before its config named them keeps the table alone
    path.write_text(json.dumps({"results": [{**row, "requests": 10}]}))
    assert not any(line.startswith("Setting") for line in card._live_section(path, "a run"))
