"""`edgeroute bench peers`: the gateway beside nginx and other routers, in one run.

This drives the shared harness (`../shared/bench-peers/run_all.sh`, or `--harness`),
which puts every target in front of the same two mock backends: the gateway on CPU 1,
the load generator and backends on CPU 0, interleaved rounds, medians. The gateway
is added as one target per policy, from `bench/peers/edgeroute.sh`. The harness's
`setup.sh` installs nginx, wrk and the peers; a peer that is not installed is skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from edgeroute.results_io import output_dir

ROOT = Path(__file__).resolve().parents[2]  # the repository
TARGET = Path(__file__).resolve().parent / "peers" / "edgeroute.sh"
DEFAULT_HARNESS = ROOT.parent / "shared" / "bench-peers"


def target_files(policies: list[str], directory: Path, first_port: int = 8300) -> list[Path]:
    """One harness target per policy, named `edgeroute` (the first) or `edgeroute-<policy>`,
    on consecutive ports."""
    files = []
    for i, policy in enumerate(policies):
        name = "edgeroute" if i == 0 else f"edgeroute-{policy.replace('_', '-')}"
        f = directory / f"{name}.sh"
        f.write_text(
            f"EDGEROUTE_NAME={name}\nEDGEROUTE_POLICY={policy}\nEDGEROUTE_PORT={first_port + i}\n"
            f'source "{TARGET}"\n'
        )
        files.append(f)
    return files


def main(
    quick: bool, harness: Path | None, policies: list[str], only: str | None, rounds: int | None
) -> None:
    where = harness or Path(os.environ.get("EDGEROUTE_BENCH_PEERS", DEFAULT_HARNESS))
    run_all = where / "run_all.sh"
    if not run_all.exists():
        sys.exit(f"no harness at {where} (give --harness)")
    out = output_dir(quick) / "peers.md"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["bash", str(run_all), "--out", str(out)]
        for f in target_files(policies, Path(tmp)):
            cmd += ["--target", str(f)]
        if quick:
            cmd.append("--quick")
        if only:
            cmd += ["--only", only]
        if rounds:
            cmd += ["--rounds", str(rounds)]
        env = {**os.environ, "EDGEROUTE_PY": sys.executable, "EDGEROUTE_ROOT": str(ROOT)}
        print(" ".join(cmd), flush=True)
        code = subprocess.call(cmd, env=env)
    if code != 0:
        sys.exit(code)
    print(f"\nwrote {out}")
