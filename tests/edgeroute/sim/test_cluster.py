"""The disaggregated-serving simulator, on a short slice of the real Mooncake trace
(and, where the data folder is not needed, on one written here)."""

from __future__ import annotations

import statistics
from pathlib import Path

from edgeroute.sim.cluster import SimConfig, capacity, simulate
from edgeroute.sim.fattree import FatTree, FatTreeConfig
from edgeroute.sim.workload import PROFILES, TraceRequest, read_mooncake, select
from policies import PipelineSpec
from tests.support import DATA_DIR, needs_data, synthetic_mooncake

TRACE = DATA_DIR / "mooncake" / "conversation_trace.jsonl.gz"
needs_trace = needs_data("the Mooncake trace", TRACE)


def rag() -> list[TraceRequest]:
    return select(read_mooncake(Path(TRACE)), PROFILES["rag"])


def test_the_default_fat_tree_is_the_papers() -> None:
    tree = FatTree.build(FatTreeConfig())
    roles = [i.role for i in tree.instances.values()]
    assert len(roles) == 16 and roles.count("prefill") == 4
    tiers = {tree.tier("p0.0", d) for d in tree.instances if d.startswith("d")}
    assert tiers == {"rack", "pod", "cluster"}  # no decode shares a prefill's server
    # A lone flow gets its tier's bandwidth: the cap, below every fabric link.
    assert tree.cap("cluster") == 12.5e9 / 8
    assert all(
        min(tree.net.capacity[link] for link in path) >= tree.cap("cluster")
        for path in tree.paths("p0.0", "d7.1")
    )


def test_every_request_completes_and_the_run_is_deterministic(tmp_path: Path) -> None:
    # A Mooncake-format trace written here: this needs no data folder.
    path = synthetic_mooncake(tmp_path / "t.jsonl", 600, 1200.0, (4096, 32768), (50, 500))
    trace = select(read_mooncake(path), PROFILES["rag"])
    cfg = SimConfig(
        PipelineSpec(policy="netkv_full"),
        rate=2.0,
        warmup=1.0,
        measure=4.0,
        trace_start=300.0,
        seed=3,
    )
    a = simulate(cfg, trace)
    b = simulate(cfg, trace)
    assert a and all(r.finished == r.finished for r in a)
    assert [(r.decode, r.ttft) for r in a] == [(r.decode, r.ttft) for r in b]
    assert all(r.ttft >= r.transfer >= 0 for r in a)


@needs_trace
def test_netkv_beats_round_robin_on_ttft_and_transfer() -> None:
    trace = rag()
    base = SimConfig(PipelineSpec(), rate=1.0, warmup=2.0, measure=8.0, trace_start=1200.0)
    rate = capacity(trace, base)

    def mean(policy: str, attr: str) -> float:
        runs = [
            simulate(
                SimConfig(
                    PipelineSpec(policy=policy),
                    rate=rate,
                    warmup=2.0,
                    measure=8.0,
                    trace_start=1200.0 + 300 * s,
                    seed=s,
                ),
                trace,
            )
            for s in range(2)
        ]
        return statistics.fmean(getattr(r, attr) for reqs in runs for r in reqs)

    assert mean("netkv_full", "ttft") < mean("decode_rr", "ttft")
    assert mean("netkv_full", "transfer") < mean("decode_rr", "transfer")
