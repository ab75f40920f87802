"""`bench live` and `bench netkv` take any trace of their formats in their stride,
including one shaped like a held-out trace that broke `bench netkv`: about 1,000 s
long, inputs of 20-40K tokens (some too long for every worker), outputs of 3-6."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from edgeroute import results_io
from edgeroute.bench.live import (
    ROUTERS,
    Settings,
    arrivals,
    body_for,
    gateway_clock,
    headers_for,
    main,
    task_of,
    window,
)
from edgeroute.bench.live_pools import ADMIN_TOKEN, PD_TOPOLOGY, PHYSICAL, POOLS
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


def test_a_routerbench_prompt_set_is_a_trace_of_real_prompts(tmp_path: Path) -> None:
    path = tmp_path / "prompts.csv"
    rows = [
        ["", "sample_id", "prompt", "eval_name", "mistralai/mistral-7b-chat"],
        ["1", "mbpp.1", "['Write a python function to add two numbers.']", "mbpp", "1.0"],
        ["2", "mbpp.2", "Reverse a string, plainly written.", "mbpp", "0.0"],
        ["3", "arc.1", "['']", "arc-challenge", "1.0"],  # an empty prompt: left out
    ]
    path.write_text("\n".join(",".join(f'"{c}"' for c in row) for row in rows) + "\n")
    first, second = read_trace(path)
    assert first.prompt == "Write a python function to add two numbers."
    assert second.prompt == "Reverse a string, plainly written." and second.task == "mbpp"
    assert first.t == 0.0 < second.t and first.output_len == 0
    assert read_trace(path) == [first, second]  # the same arrivals for every reader
    body = body_for(first, 0, POOLS["experts"])
    assert body["messages"][0]["content"] == first.prompt
    assert "max_tokens" not in body and "ignore_eos" not in body  # the model's own length


def test_the_pools_are_what_they_say() -> None:
    halves = [set(m.hosted) for m in POOLS["moe"].members]
    for layer in range(32):
        for expert in range(8):
            assert sum((layer, expert) in h for h in halves) == 2  # every expert twice
    assert all(len(h) == 32 * 4 for h in halves)
    assert len({frozenset(h) for h in halves}) == 4
    # No worker holds a whole class's layer set: its share of experts 0-3 varies by layer.
    assert all(0 < sum(e < 4 for _, e in h) < len(h) for h in halves)

    pd = POOLS["pd"]
    racks = {n: i["rack"] for n, i in PD_TOPOLOGY["instances"].items()}
    prefill_racks = {racks[m.name] for m in pd.members if m.role == "prefill"}
    decode_racks = {racks[m.name] for m in pd.members if m.role == "decode"}
    assert prefill_racks and decode_racks and not prefill_racks & decode_racks
    urls = [f"http://w{i}" for i in range(len(pd.members))]
    args = pd.peer_workers(urls, "vllm-router")
    assert args[0] == "--vllm-pd-disaggregation"
    assert args.count("--prefill") == 2 and args.count("--decode") == 4
    with pytest.raises(ValueError, match="prefill/decode"):
        pd.peer_workers(urls, "sglang-router")
    backends = pd.backends(urls)
    assert [b["role"] for b in backends].count("decode") == 4
    assert pd.gateway_settings()["oracle"] == PD_TOPOLOGY

    net = POOLS["pd-net"]
    assert net.gateway_settings()["oracle"]["tier_bandwidth"] != PHYSICAL["tier_bandwidth"]
    assert not net.gateway_settings()["oracle"]["congestion"]  # only telemetry brings it
    assert net.gateway_settings()["admin_token"] == ADMIN_TOKEN
    folder = Path(tempfile.mkdtemp())
    decode = [i for i, m in enumerate(net.members) if m.role == "decode"]
    commands = [net.worker_command(i, 9000 + i, 8.0, folder, None, seed=2) for i in decode]
    assert all("--background" in c and "--redis-url" not in c for c in commands)
    assert yaml.safe_load((folder / "topology.yaml").read_text()) == PHYSICAL
    spots = [net.hot_spots(i, 2) for i in decode]
    assert len({s["cluster"] for s in spots}) == len(decode)  # uneven across instances
    assert spots != [net.hot_spots(i, 3) for i in decode]  # and moved by the seed
    prefill = net.worker_command(0, 9000, 8.0, folder, None, seed=2)
    assert "--background" not in prefill

    moe = POOLS["moe"]
    body = body_for(TraceRequest(0.0, 100, 5, ()), 3, moe)
    assert body["metadata"]["task"] in moe.tasks
    assert headers_for(3, moe) == {"x-edgeroute-task": body["metadata"]["task"]}
    assert {task_of(i, moe) for i in range(40)} == set(moe.tasks)


def test_a_router_on_a_pool_it_cannot_route_is_refused_by_name(tmp_path: Path) -> None:
    settings = Settings(
        trace=tmp_path / "never-read.jsonl",
        routers=("qos_drl", "round_robin"),
        loads=(1.0,),
        seeds=(1,),
        seconds=10.0,
        speedup=8.0,
        ttft_slo=10.0,
        tpot_slo=0.1,
        pool="pd",
    )
    with pytest.raises(ValueError, match=r"\['qos_drl', 'round_robin'\] do not route the pd pool"):
        main(settings, None, quick=True, name="never")


def test_bench_live_on_a_prefill_decode_pool_ours_and_vllm_routers_pd_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs without the peers installed too: a router that cannot start is reported and
    left out, never a crash."""
    monkeypatch.setattr(results_io, "QUICK", tmp_path / "out")
    trace = synthetic_mooncake(tmp_path / "t.jsonl", inputs=(2_000, 6_000), outputs=(8, 24))
    settings = Settings(
        trace=trace,
        routers=("netkv_full", "decode_rr", "vllm-router pd round_robin"),
        loads=(1.0,),
        seeds=(1,),
        seconds=120.0,
        speedup=8.0,
        ttft_slo=30.0,
        tpot_slo=0.2,
        pool="pd",
        capacity=0.3,
    )
    main(settings, None, quick=True, name="live_pd")
    rows = json.loads((tmp_path / "out" / "live_pd.json").read_text())["results"]
    ours = {r["router"]: r for r in rows if not r["router"].startswith("vllm")}
    assert set(ours) == {"netkv_full", "decode_rr"}
    for r in rows:
        assert r["requests"] > 0 and r["failed"] == 0
        assert r["served"] == r["requests"]  # every request went prefill, transfer, decode


def test_a_time_scaled_run_gives_qos_drl_its_target_in_the_gateways_clock() -> None:
    """At x10 the gateway sees every latency ten times shorter than the emulated one:
    qos_drl must judge 30 emulated ms per token against 3 real ms."""
    spec = gateway_clock({"policy": "qos_drl", "model": "m"}, 0.030, 10.0)
    assert spec == {"policy": "qos_drl", "model": "m", "latency_ms": pytest.approx(3.0)}
    other = {"policy": "least_load"}
    assert gateway_clock(other, 0.030, 10.0) is other


def test_a_router_that_cannot_start_fails_the_run_with_its_own_last_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hostile twin of a router's start-up: its port is someone else's. The run ends
    with the gateway's exit and why (CI once saw only "exited with 3", nothing of why)."""
    import socket

    from edgeroute.bench import live
    from edgeroute.bench.overhead import ServerExited

    pool = POOLS["mixed"]
    with socket.create_server(("127.0.0.1", 0)) as taken:
        monkeypatch.setattr(live, "free_ports", lambda n: [taken.getsockname()[1]] * n)
        with (
            pytest.raises(
                ServerExited, match=r"exited with 2: .*cannot listen on .*Address already in use"
            ),
            live.running(ROUTERS["round_robin"], pool, ["http://127.0.0.1:9"] * len(pool.members)),
        ):
            pass
