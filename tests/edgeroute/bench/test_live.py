"""`bench live` and `bench netkv` take any trace of their formats in their stride,
including one shaped like a held-out trace that broke `bench netkv`: about 1,000 s
long, inputs of 20-40K tokens (some too long for every worker), outputs of 3-6."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgeroute import results_io
from edgeroute.bench.live import ROUTERS, Settings, arrivals, main, window
from edgeroute.sim.workload import TraceRequest, prompt_for, read_trace
from tests.support import synthetic_mooncake


def short_long_trace(path: Path) -> Path:
    return synthetic_mooncake(path)


def test_both_trace_formats_are_read_and_prompts_share_their_blocks(tmp_path: Path) -> None:
    mooncake = read_trace(short_long_trace(tmp_path / "t.jsonl"))
    assert (len(mooncake) == 120 and mooncake[0].t == 0.0) or mooncake[0].t > 0
    azure = tmp_path / "a.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
    )
    (a, b) = read_trace(azure)
    assert (a.t, a.input_len, a.output_len, a.hash_ids) == (0.0, 374, 44, ())
    assert b.t == pytest.approx(4.314579, abs=1e-5)
    one = TraceRequest(0.0, 1024, 1, (5, 6))
    two = TraceRequest(0.0, 1024, 1, (5, 7))
    p1, p2 = prompt_for(one, 1), prompt_for(two, 2)
    assert len(p1) == len(p2) == 1024 * 4
    assert p1[:2048] == p2[:2048] and p1[2048:] != p2[2048:]  # block 5 shared, then not
    with pytest.raises(ValueError, match="neither"):
        bad = tmp_path / "bad.txt"
        bad.write_text("hello\n")
        read_trace(bad)


def test_windows_and_arrivals_follow_the_trace_not_fixed_seconds() -> None:
    trace = [TraceRequest(float(i), 10, 1, ()) for i in range(100)]
    assert window(trace, 20)[0].t == 10.0  # a tenth of the way in
    assert len(window(trace, 500)) == 100  # all of a shorter trace
    timed = arrivals(window(trace, 50), rate=2.0, seconds=10.0, seed=3)
    assert len(timed) in (20, 21) and all(0 <= t <= 10.0 for t, _ in timed)
    assert timed != arrivals(window(trace, 50), rate=2.0, seconds=10.0, seed=4)


def test_bench_live_counts_what_no_worker_can_hold_and_serves_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results_io, "QUICK", tmp_path / "out")
    settings = Settings(
        trace=short_long_trace(tmp_path / "short.jsonl"),
        routers=("round_robin", "least_load"),
        loads=(1.0,),
        seeds=(1,),
        seconds=40.0,
        speedup=8.0,
        ttft_slo=30.0,
        tpot_slo=0.2,
    )
    main(settings, None, quick=True, name="live_short")
    rows = json.loads((tmp_path / "out" / "live_short.json").read_text())["results"]
    assert {r["router"] for r in rows} == {"round_robin", "least_load"}
    for r in rows:
        assert r["requests"] > 0 and r["served"] > 0
        assert r["unservable"] > 0  # inputs over every worker's context
        assert r["failed"] == 0
        assert r["requests"] == r["served"] + r["refused"] + r["unservable"]
    assert (tmp_path / "out" / "live_short_ttft_cdf.png").exists()


def test_bench_netkv_runs_on_a_trace_shorter_than_its_old_fixed_window(tmp_path: Path) -> None:
    trace = short_long_trace(tmp_path / "short.jsonl")
    r = subprocess.run(
        [sys.executable, "-m", "edgeroute.cli", "bench", "netkv", "--quick", "--trace", str(trace)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_every_router_is_named_once() -> None:
    kinds = {r.kind for r in ROUTERS.values()}
    assert kinds == {"edgeroute", "vllm-router", "sglang-router"}
    assert "llm-d default (re-created)" in ROUTERS and "composed" in ROUTERS
