"""MoE worker mode: remote experts cost time, statistics are kept per class, placements
can be changed live."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support import engine_seconds_per_token, needs_data

pytestmark = needs_data("the MoE routing data")
HALF = [(layer, e) for layer in range(32) for e in range(4)]  # experts 0-3 of each layer
EVERYTHING = [(layer, e) for layer in range(32) for e in range(8)]


def per_token(url: str, worker: Any, task: str) -> float:
    def send() -> httpx.Response:
        return httpx.post(
            url + "/v1/chat/completions",
            timeout=30,
            headers={"x-edgeroute-task": task},
            json={
                "model": "mixtral-8x7b-chat",
                "max_tokens": 30,
                "messages": [{"role": "user", "content": "Solve 2+2."}],
            },
        )

    return engine_seconds_per_token(worker, send)


def test_remote_experts_cost_time_and_a_new_placement_removes_the_cost(
    start_worker: Callable[..., tuple[str, Any]],
) -> None:
    url, worker = start_worker(
        profile="mixtral-8x7b-chat", speedup=10.0, moe={"hosted": HALF}, admin_token="s3cret"
    )
    slow = per_token(url, worker, "gsm8k")
    stats = httpx.get(url + "/moe/stats").json()
    assert stats["classes"]["gsm8k"] and len(stats["classes"]["gsm8k"]) == 32
    assert 0.2 < stats["local_ratio"] < 0.8  # about half the activations are remote
    r = httpx.put(
        url + "/admin/placement",
        json={"hosted": EVERYTHING},
        headers={"authorization": "Bearer s3cret"},
        timeout=60,
    )
    assert r.status_code == 200
    # 128 experts moved at 0.35 GB / 2 GB/s each: the emulated transfer time.
    assert r.json()["transfer_s"] == pytest.approx(128 * 0.35 / 2.0)
    fast = per_token(url, worker, "gsm8k")
    # Two remote experts a token per layer, at ~5 ms each: far slower than local.
    assert fast < slow * 0.6, (slow, fast)
    assert httpx.get(url + "/moe/stats").json()["migrations"] == 1


def test_placement_requires_the_admin_token_when_one_is_set(
    start_worker: Callable[..., tuple[str, Any]],
) -> None:
    url, _ = start_worker(
        profile="mixtral-8x7b-chat", speedup=10.0, moe={"hosted": HALF}, admin_token="s3cret"
    )
    for headers in ({}, {"authorization": "Bearer wrong"}):
        r = httpx.put(url + "/admin/placement", json={"hosted": EVERYTHING}, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "AuthenticationError"
    assert httpx.get(url + "/moe/stats").json()["migrations"] == 0
    r = httpx.put(
        url + "/admin/placement",
        json={"hosted": HALF},
        headers={"authorization": "Bearer s3cret"},
        timeout=60,
    )
    assert r.status_code == 200


def test_mixtral_classes_with_records_replay_them_token_by_token() -> None:
    """A gsm8k request walks one recorded GSM8K sequence; its next token is the next
    record, and a class without records is drawn from its distribution."""
    import numpy as np

    from tests.support import DATA_DIR
    from workers.engine import Plan, Sequence
    from workers.moe import real_sequences
    from workers.moe_host import MoEConfig, MoEHost

    host = MoEHost(MoEConfig(), DATA_DIR)
    seq = Sequence(id="req-1", prompt_tokens=5, target_tokens=8, task="gsm8k")
    seen = []
    for k in range(8):
        seq.generated = k
        before = host.stats.get("gsm8k", np.zeros((32, 8))).copy()
        host.iteration_cost(Plan(prefill=[], decode=[seq], prefill_tokens=0, decode_context=0))
        added = host.stats["gsm8k"] - before
        seen.append([set(np.flatnonzero(row)) for row in added])
    recorded = [
        [set(layer) for layer in token] for s in real_sequences(DATA_DIR)["gsm8k"] for token in s
    ]
    starts = [i for i in range(len(recorded) - 8) if recorded[i] == seen[0]]
    assert starts and any(recorded[i : i + 8] == seen for i in starts)
    host.iteration_cost(
        Plan(
            prefill=[],
            decode=[Sequence("r2", 5, 8, task="chat")],
            prefill_tokens=0,
            decode_context=0,
        )
    )
    assert host.stats["chat"].sum() == 32 * 2
