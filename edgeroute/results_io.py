"""The results format of DESIGN.md section 9: one JSON file and one Markdown table a run."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "bench" / "results"


def machine() -> dict[str, Any]:
    import os

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(out)


def write(
    name: str,
    config: dict[str, Any],
    rows: list[dict[str, Any]],
    columns: list[str],
    json_path: str | None,
    notes: str = "",
    quick: bool = False,
    table_rows: list[dict[str, Any]] | None = None,
) -> None:
    """`table_rows`: the rows of the Markdown table when not all of `rows`."""
    payload = {"benchmark": name, "config": {**config, "machine": machine()}, "results": rows}
    md = table(rows if table_rows is None else table_rows, columns)
    print(md)
    if json_path:
        Path(json_path).write_text(json.dumps(payload, indent=1) + "\n")
    if not quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=1) + "\n")
        cmd = config.get("command", "")
        (RESULTS / f"{name}.md").write_text(
            f"# {name}\n\nCommand: `{cmd}`\n\nMachine: {machine()}\n\n{md}\n\n{notes}\n"
        )
        print(f"\nwrote {RESULTS / (name + '.json')} and .md")
