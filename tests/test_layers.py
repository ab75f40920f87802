"""The layer contract (pyproject.toml, `lint-imports` in `make lint`) holds, and
would catch an import that breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("edgeroute", "workers", "gateway", "policies", "oracle")


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(exe), "--no-cache"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The packages' sources and the contract, copied."""
    for name in PACKAGES:
        shutil.copytree(
            ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("*.pyc", "results", "data")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("gateway/app.py", "import workers.engine"),
        ("gateway/proxy.py", "from edgeroute.sim import edge"),
        ("policies/pipeline.py", "import gateway.errors"),
        ("oracle/topology.py", "import policies.types"),
        ("edgeroute/sim/edge.py", "import edgeroute.qos.train"),
    ],
)
def test_an_import_against_the_layers_fails_the_lint(tree: Path, module: str, line: str) -> None:
    assert lint_imports(tree).returncode == 0
    path = tree / module
    text = path.read_text()
    marker = "from __future__ import annotations\n"
    path.write_text(text.replace(marker, marker + line + "  # noqa\n", 1))
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout
