"""`bench netkv`'s statistics: Experiment 2's fixed lengths, CLA* chosen per point among
its weights, and reductions paired by seed."""

from __future__ import annotations

import math

from edgeroute.bench.netkv import fixed_length, point, reduction, with_cla_star
from edgeroute.sim.workload import MOONCAKE_BLOCK, TraceRequest


def test_fixed_length_keeps_the_arrivals_and_outputs_and_sets_every_input() -> None:
    trace = [TraceRequest(1.5, 3000, 40, (7, 8, 9, 10, 11, 12)), TraceRequest(2.0, 500, 9, (7,))]
    out = fixed_length(trace, 4096)
    assert [(r.t, r.output_len, r.input_len) for r in out] == [(1.5, 40, 4096), (2.0, 9, 4096)]
    blocks = 4096 // MOONCAKE_BLOCK
    assert out[0].hash_ids == (7, 8, 9, 10, 11, 12, -1, -2)  # its own blocks, extended
    assert out[1].hash_ids[0] == 7 and len(out[1].hash_ids) == blocks
    assert len(set(out[0].hash_ids[6:]) & set(out[1].hash_ids[1:])) == 0  # not shared
    assert fixed_length(trace, 1024)[0].hash_ids == (7, 8)  # cut


def seeds(*ttfts: float) -> list[dict[str, float]]:
    return [
        {
            "ttft_mean_s": t,
            "ttft_p99_s": t,
            "tbt_ms": 1.0,
            "slo": 1.0,
            "xfer_ms": 1.0,
            "tier_pod": 0.5,
            "tier_cluster": 0.5,
            "requests": 10,
            "memory_blocked": 0,
        }
        for t in ttfts
    ]


def test_cla_star_is_the_best_weight_at_each_point_and_reductions_are_paired() -> None:
    setting = {"experiment": "1-load", "setting": "load_pct 100"}
    rows = [
        point(setting, "RR", seeds(2.0, 4.0)),
        point(setting, "CLA w=0.2", seeds(1.9, 3.0)),
        point(setting, "CLA w=0.5", seeds(1.5, 3.1)),
        point(setting, "CLA w=0.8", seeds(2.5, 3.5)),
        point(setting, "NetKV-full", seeds(1.0, 2.0)),
    ]
    rows = with_cla_star(rows)
    star = [r for r in rows if r["policy"].startswith("CLA*")]
    assert [r["policy"] for r in star] == ["CLA* (w=0.5)"]  # mean 2.3 beats 2.45 and 3.0
    # Paired by seed: (2-1)/2 and (4-2)/4 are both 50%.
    assert reduction(rows, "load_pct 100", "RR", "NetKV-full") == "50 ± 0"
    mean = float(reduction(rows, "load_pct 100", "CLA*", "NetKV-full").split()[0])
    assert math.isclose(mean, ((1.5 - 1.0) / 1.5 + (3.1 - 2.0) / 3.1) / 2 * 100, rel_tol=1e-2)
    assert reduction(rows, "load_pct 100", "LA", "NetKV-full") == "n/a"
