"""The code in docs/writing-a-policy.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from policies import BackendView, ClusterView, RequestInfo

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-a-policy.md"


def test_the_example_scorer_registers_builds_and_decides() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 2
    namespace: dict[str, Any] = {}
    exec(compile(blocks[0] + blocks[1], str(DOC), "exec"), namespace)
    policy = namespace["policy"]
    busy = BackendView("busy", models=frozenset({"m"}), waiting=9, stats_age=0.0)
    idle = BackendView("idle", models=frozenset({"m"}), waiting=1, stats_age=0.0)
    view = ClusterView((busy, idle))
    assert policy.decide(RequestInfo(model="m", prompt_tokens=4), view).backend_id == "idle"
