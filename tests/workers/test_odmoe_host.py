"""The `odmoe` worker mode: decoding pays the on-demand pipeline's losses, and the
worker reports its speed and each node's memory."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support import engine_seconds_per_token
from workers.server import Worker, WorkerConfig

Start = Callable[..., tuple[str, Any]]


def per_token(url: str, worker: Any) -> float:
    def send() -> httpx.Response:
        return httpx.post(
            url + "/v1/chat/completions",
            timeout=60,
            json={
                "model": "mixtral-8x7b-chat",
                "max_tokens": 24,
                "messages": [{"role": "user", "content": "Write a long story."}],
            },
        )

    return engine_seconds_per_token(worker, send)


def test_good_predictions_decode_near_cached_speed_and_misses_stall(start_worker: Start) -> None:
    shadowed, shadowed_worker = start_worker(profile="mixtral-8x7b-chat", speedup=50.0, odmoe={})
    blind, blind_worker = start_worker(
        profile="mixtral-8x7b-chat", speedup=50.0, odmoe={"layer_miss": 1.0, "kv_period": None}
    )
    fast, slow = per_token(shadowed, shadowed_worker), per_token(blind, blind_worker)
    assert slow > 2 * fast, (fast, slow)

    good = httpx.get(shadowed + "/odmoe/stats").json()
    bad = httpx.get(blind + "/odmoe/stats").json()
    assert good["decode_steps"] >= 20 and bad["mispredicted_layers"] == 32 * bad["decode_steps"]
    # Eq. 1's window (25 ms) is shorter than a load (29.3 ms): even perfect prediction
    # stalls a little, and a miss costs a full load after the gating.
    assert 0.6 < good["decode_tokens_per_s"] / good["cached_tokens_per_s"] < 0.9
    assert bad["decode_tokens_per_s"] / bad["cached_tokens_per_s"] < 0.3
    memory = good["memory_gb"]
    assert memory["worker-0"] == pytest.approx(0.352) and len(memory) == 2 + 8


def test_a_worker_runs_one_moe_mode() -> None:
    with pytest.raises(ValueError, match="either"):
        Worker(WorkerConfig(profile="mixtral-8x7b-chat", moe={}, odmoe={}))  # type: ignore[arg-type]


def test_the_expected_token_time_matches_the_sampled_pipeline() -> None:
    from policies.odmoe import OdMoEConfig, alignment_seconds, token_seconds

    cfg = OdMoEConfig()
    pipe, rng = cfg.pipeline(), random.Random(3)
    late = alignment_seconds(pipe, cfg.layers, kv=True)
    sampled = [
        token_seconds(pipe, 32, [rng.random() < cfg.layer_miss for _ in range(32)], late)
        for _ in range(2000)
    ]
    assert cfg.expected_token_seconds() == pytest.approx(sum(sampled) / len(sampled), rel=0.02)


def test_the_gateway_models_an_odmoe_backend_by_its_pipeline() -> None:
    from gateway.backends import BackendPool
    from gateway.settings import BackendConfig, CircuitConfig
    from policies.odmoe import OdMoEConfig

    pool = BackendPool(CircuitConfig(), stale_after=5.0, prefix_entries=16)
    pool.set_configs(
        [
            BackendConfig(url="http://127.0.0.1:9001", id="od", odmoe=OdMoEConfig()),
            BackendConfig(url="http://127.0.0.1:9002", id="plain"),
        ]
    )
    pool.rebuild()
    views = {v.id: v for v in pool.view.backends}
    assert views["od"].iter_base == pytest.approx(OdMoEConfig().expected_token_seconds())
    assert views["plain"].iter_base == 0.02
