"""`bench qos-rollout`: an agent against itself improved by one rollout step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeroute.bench.qos_rollout import lookahead_named, main
from edgeroute.qos.rollout import Lookahead
from policies.predictor import DEFAULT_MODEL_DIR
from tests.support import DATA_DIR, needs_data

AGENT = DEFAULT_MODEL_DIR  # the agent served by default


def test_a_lookahead_other_than_the_default_names_its_results_and_flags() -> None:
    assert lookahead_named("x", Lookahead()) == ("x", "")
    assert lookahead_named("x", Lookahead(16, 2, believed=False, own=True)) == (
        "x_horizon-16_futures-2_truth_own",
        " --horizon 16 --futures 2 --truth --own",
    )


@needs_data("the RouterDC data")
def test_the_command_writes_the_agent_and_its_rollout_seed_by_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEROUTE_DATA_DIR", str(DATA_DIR))
    out = tmp_path / "rollout.json"
    look = Lookahead(2, own=True)
    main(True, 1, 2, str(out), {"served": [AGENT]}, [8.0], look, "routerdc", 1000.0)
    written = json.loads(out.read_text())
    assert written["benchmark"] == (
        "qos_rollout_routerdc_scrape-1000ms_lambda-8_seed-1_seeds-2_horizon-2_own_served"
    )
    assert written["config"]["command"].startswith(
        "edgeroute bench qos-rollout --quality routerdc --scrape-ms 1000 --rates 8 --seed 1 "
        "--seeds 2 --horizon 2 --own --model served="
    )
    rows = {r["policy"]: r for r in written["results"]}
    assert set(rows) == {"served", "rollout(served)"}
    assert all(len(r["per_seed_qos"]) == 2 for r in rows.values())
    assert rows["served"]["paired_minus_base"] == ""
    assert "above on" in rows["rollout(served)"]["paired_minus_base"]
