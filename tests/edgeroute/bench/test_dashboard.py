"""Drawing the dashboard's panels from Prometheus answers (the run itself needs Prometheus)."""

from __future__ import annotations

from pathlib import Path

from edgeroute.bench.dashboard import legend, render


def test_legends_follow_grafanas_format() -> None:
    labels = {"model": "edge", "backend": "worker-1"}
    assert legend("{{model}} on {{ backend }}", labels) == "edge on worker-1"
    assert legend("", labels) == "backend=worker-1,model=edge"
    assert legend("", {}) == "value"


def test_panels_are_drawn_with_their_series_and_phase_marks(tmp_path: Path) -> None:
    series = {"labels": {"backend": "a"}, "t": [0.0, 2.0, 4.0], "v": [1.0, 3.0, 2.0]}
    panels = [
        {
            "title": "Rate",
            "type": "timeseries",
            "unit": "reqps",
            "targets": [{"expr": "x", "legend": "{{backend}}", "series": [series]}],
        },
        {
            "title": "Empty",
            "type": "timeseries",
            "unit": "",
            "targets": [{"expr": "y", "legend": "", "series": []}],
        },
        {
            "title": "Replicas",
            "type": "stat",
            "unit": "short",
            "targets": [{"expr": "z", "legend": "replicas", "series": [series]}],
        },
    ]
    out = tmp_path / "dashboard.png"
    render(panels, [("steady", 0.0), ("overload", 2.0)], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
