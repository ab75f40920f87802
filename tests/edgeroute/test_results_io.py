"""Results files: what a run wrote, and whether it changed a tracked result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgeroute import results_io


@pytest.fixture
def folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setattr(results_io, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(results_io, "QUICK", tmp_path / "quick")
    return tmp_path / "results", tmp_path / "quick"


def test_a_full_run_says_which_tracked_files_changed(
    folders: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    results, _ = folders
    results.mkdir()
    results_io.save_text(results / "a.md", "one")
    assert "a.md (new)  <- a tracked result changed" in capsys.readouterr().out
    results_io.save_text(results / "a.md", "one")
    out = capsys.readouterr().out
    assert "a.md (unchanged)" in out and "<-" not in out
    results_io.save_text(results / "a.md", "two")
    assert "a.md (changed)  <- a tracked result changed" in capsys.readouterr().out


def test_write_names_the_folder_and_draws_the_plot(
    folders: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    results, quick = folders
    rows = [{"n": n, "policy": p, "us": n * k} for n in (8, 64) for p, k in (("a", 1), ("b", 2))]
    plot = results_io.Plot("n", ("us",), ("policy",), "t", log_x=True)
    results_io.write(
        "demo", {"command": "x"}, rows, ["n", "policy", "us"], None, quick=True, plot=plot
    )
    out = capsys.readouterr().out
    assert f"quick run: its files go to {quick}" in out
    assert sorted(p.name for p in quick.iterdir()) == ["demo.json", "demo.md", "demo.png"]
    assert not results.exists()
    results_io.write("demo", {"command": "x"}, rows, ["n", "policy", "us"], None, plot=plot)
    assert sorted(p.name for p in results.iterdir()) == ["demo.json", "demo.md", "demo.png"]


def test_results_name_the_processor_they_were_measured_on() -> None:
    cpu = results_io.machine()["cpu"]
    assert isinstance(cpu, str) and cpu and cpu != "unknown"


def test_a_missing_value_is_a_dash_in_a_table() -> None:
    rows: list[dict[str, Any]] = [{"a": 0.12345, "b": None}, {"a": 12345.0}]
    assert results_io.table(rows, ["a", "b"]).splitlines()[2:] == ["| 0.123 | - |", "| 12,345 |  |"]


def test_paths_inside_the_checkout_are_recorded_relative_to_it(tmp_path: Path) -> None:
    model = results_io.ROOT / "models" / "qos" / "runs" / "full-s0"
    assert results_io.recorded(model) == "models/qos/runs/full-s0"
    # the same folder named through a detour resolves to the same record
    assert results_io.recorded(model / ".." / "full-s0") == "models/qos/runs/full-s0"
    # elsewhere a path stays as given: it is all a reader can be told
    assert results_io.recorded(tmp_path / "run") == str(tmp_path / "run")


def test_the_machine_names_the_versions_of_what_moves_the_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from importlib.metadata import version

    packages = results_io.machine()["packages"]
    assert set(packages) == set(results_io.MEASURED_PACKAGES)
    assert packages["onnxruntime"] == version("onnxruntime")
    monkeypatch.setattr(results_io, "MEASURED_PACKAGES", ("numpy", "no-such-package-here"))
    assert results_io.package_versions() == {
        "numpy": version("numpy"),
        "no-such-package-here": "absent",
    }
