"""Training the small MoE language model: it learns, and a killed run resumes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeroute.sim.moe_lm import TrainSettings, corpus, train
from tests.support import DATA_DIR, needs_data, wait_until

pytestmark = needs_data("the RouterBench and RouteLLM text")


def test_the_corpus_holds_out_the_prompts_it_evaluates_on() -> None:
    text, held_out = corpus(DATA_DIR)
    assert len(text) > 1_000_000 and len(held_out) > 200
    # A held-out GSM8K question is not in the training text.
    assert held_out[0][:80] not in text


def test_a_killed_run_resumes_from_its_checkpoint_and_the_loss_falls(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lm.pt"
    ckpt = out.with_suffix(".ckpt")
    cmd = [sys.executable, "-m", "edgeroute.cli", "train", "moe-lm", "--out", str(out)]
    cmd += ["--steps", "1000", "--eval-every", "2", "--checkpoint-every", "2"]
    env = dict(os.environ, EDGEROUTE_DATA_DIR=str(DATA_DIR))
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    try:
        wait_until(ckpt.exists, timeout=300, every=0.2)
    finally:
        proc.kill()
        proc.wait()
    assert not out.exists()  # killed before it finished
    record = train(DATA_DIR, out, TrainSettings(steps=8, eval_every=2, checkpoint_every=2))
    resumed = capfd.readouterr().err
    assert "resumed at step" in resumed
    at = int(resumed.split("resumed at step ")[1].split()[0])
    assert 2 <= at < 8
    curve = record["curve"]
    assert isinstance(curve, list)
    assert [c["step"] for c in curve] == list(range(2, 9, 2))  # one curve across both runs
    assert curve[-1]["val_loss"] < curve[0]["val_loss"]
    assert out.exists() and not ckpt.exists()
