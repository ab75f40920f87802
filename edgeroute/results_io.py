"""The results format of DESIGN.md section 9: one JSON file and one Markdown table a run."""

from __future__ import annotations

import json
import platform
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "bench" / "results"
QUICK = Path(tempfile.gettempdir()) / "edgeroute-quick"


def recorded(path: Path) -> str:
    """A path as a results file records it: relative to the checkout when inside it,
    so that results name the committed models, not where one machine keeps them."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def git(*args: str) -> str | None:
    """A git command's output, run at the checkout's root (paths are relative to it),
    or None where git cannot answer."""
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def cpu_model() -> str:
    """The processor's name as Linux reports it (timings only compare on alike ones)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# The packages whose versions move the figures: the decision graphs' runtime, the
# arrays around it, training, and the servers on the request path.
MEASURED_PACKAGES = ("onnxruntime", "numpy", "torch", "uvicorn", "starlette", "httpx")


def package_versions() -> dict[str, str]:
    """The installed versions of MEASURED_PACKAGES ("absent" where one is not)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in MEASURED_PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "absent"
    return found


def machine() -> dict[str, Any]:
    import os

    return {
        "cpus": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        if v is None:  # no value: a rate with nothing to divide by
            return "-"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(out)


@dataclass(frozen=True)
class Plot:
    """A results table drawn: each of `y` against `x`, one line per value of the
    `group` columns; bars instead of lines when `x` is not a number."""

    x: str
    y: tuple[str, ...]
    group: tuple[str, ...] = ()
    title: str = ""
    log_x: bool = False
    log_y: bool = False


def draw(plot: Plot, rows: list[dict[str, Any]], path: Path) -> None:
    """Save `plot` of `rows` to `path` (nothing without matplotlib, the `bench` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"not drawn: {path.name} (matplotlib is not installed)")
        return
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(" ".join(str(r.get(g, "")) for g in plot.group), []).append(r)
    numeric = all(isinstance(r.get(plot.x), int | float) for r in rows)
    fig, axes = plt.subplots(1, len(plot.y), figsize=(5.5 * len(plot.y), 3.8), squeeze=False)
    for ax, y in zip(axes[0], plot.y, strict=True):
        width = 0.8 / max(len(groups), 1)
        for i, (label, members) in enumerate(groups.items()):
            kept = [r for r in members if isinstance(r.get(y), int | float)]
            values = [r[y] for r in kept]
            if numeric:
                ax.plot([r[plot.x] for r in kept], values, "o-", label=label or None)
            else:
                at = [j + i * width for j in range(len(kept))]
                ax.bar(at, values, width, label=label or None)
                ax.set_xticks([j + 0.4 - width / 2 for j in range(len(kept))])
                ax.set_xticklabels([str(r[plot.x]) for r in kept], rotation=30, fontsize=7)
        if plot.log_x and numeric:
            ax.set_xscale("log")
        if plot.log_y:
            ax.set_yscale("log")
        ax.set(xlabel=plot.x, ylabel=y)
        if len(groups) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(plot.title)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def output_dir(quick: bool) -> Path:
    """Where a run's files go: the tracked results folder, or for a quick run (whose
    figures are not results) a temporary folder, so that it never overwrites them."""
    out = QUICK if quick else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    return out


def _report(path: Path, before: bytes | None) -> None:
    """Say what a run did to `path`: the tracked results a full run changed stand out."""
    after = path.read_bytes()
    state = "new" if before is None else "unchanged" if before == after else "changed"
    tracked = RESULTS in path.parents
    mark = "  <- a tracked result changed" if tracked and state != "unchanged" else ""
    print(f"wrote {path} ({state}){mark}")


def _before(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def save_text(path: Path, text: str) -> None:
    before = _before(path)
    path.write_text(text)
    _report(path, before)


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """Save a matplotlib figure to `path` and say so."""
    before = _before(path)
    fig.savefig(path, dpi=dpi)
    _report(path, before)


def write(
    name: str,
    config: dict[str, Any],
    rows: list[dict[str, Any]],
    columns: list[str],
    json_path: str | None,
    notes: str = "",
    quick: bool = False,
    table_rows: list[dict[str, Any]] | None = None,
    plot: Plot | None = None,
) -> None:
    """Print the table and write `name`.json and .md (and `name`.png, drawn by `plot`):
    to the tracked results folder, or for a quick run to a temporary folder.
    `table_rows`: the rows of the Markdown table when not all of `rows`."""
    payload = {"benchmark": name, "config": {**config, "machine": machine()}, "results": rows}
    md = table(rows if table_rows is None else table_rows, columns)
    print(md)
    print()
    if json_path:
        save_text(Path(json_path), json.dumps(payload, indent=1) + "\n")
    out = output_dir(quick)
    if quick:
        print(f"quick run: its files go to {out}, not to the tracked results")
    save_text(out / f"{name}.json", json.dumps(payload, indent=1) + "\n")
    cmd = config.get("command", "")
    save_text(
        out / f"{name}.md",
        f"# {name}\n\nCommand: `{cmd}`\n\nMachine: {machine()}\n\n{md}\n\n{notes}\n",
    )
    if plot is not None:
        draw(plot, rows, out / f"{name}.png")
