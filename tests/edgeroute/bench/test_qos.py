"""`bench qos`: agents given by hand are results of their own."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgeroute.bench.qos import agents_named, main
from policies.qos_drl import DEFAULT_MODEL_DIR
from tests.support import needs_data


def test_agents_given_by_hand_get_their_own_results_and_flags() -> None:
    assert agents_named("qos_routerdc", {}) == ("qos_routerdc", "")
    name, flags = agents_named(
        "qos_live", {"wide": [Path("a/full-s0"), Path("a/full-s1")], "my run!": [Path("b")]}
    )
    assert name == "qos_live_wide_my-run-"
    assert flags == " --model wide=a/full-s0,a/full-s1 --model my run!=b"


@needs_data("the quality data")
def test_an_agent_with_another_worlds_predictor_is_refused(tmp_path: Path) -> None:
    """An actor lying outside its world's folder would fall back to the shipped
    (RouterBench) predictor and predict for models the RouterDC world does not have."""
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(DEFAULT_MODEL_DIR / "routerdc" / "actor.onnx", lone / "actor.onnx")
    with pytest.raises(SystemExit, match="not the routerdc world's"):
        main(True, 1, None, {"lone": [lone]}, None, quality="routerdc")
