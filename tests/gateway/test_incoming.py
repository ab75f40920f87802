from __future__ import annotations

from typing import Any

from gateway.arrivals import ArrivalCounts
from gateway.incoming import Incoming, RequestInfos


def incoming(body: dict[str, Any]) -> Incoming:
    return Incoming({}, "/v1/completions", b"", body, [], "m", "rid", 0.0)


def test_a_token_id_prompt_is_sized_and_hashed_by_its_ids() -> None:
    """Policies see a prompt of token ids as its length in tokens, with prefix blocks
    that two prompts sharing their first ids share."""
    infos = RequestInfos(prefix_block_tokens=64, arrivals=ArrivalCounts())
    ids = list(range(5000, 5300))
    info = infos.build(incoming({"prompt": ids}), hashed=True)
    assert info.prompt_tokens == 300 and len(info.block_hashes) == 4
    other = infos.build(incoming({"prompt": ids[:200] + [1] * 100}), hashed=True)
    assert other.block_hashes[:3] == info.block_hashes[:3]
    assert other.block_hashes[3] != info.block_hashes[3]
    batch = infos.build(incoming({"prompt": [ids, ids]}), hashed=False)
    assert batch.prompt_tokens == 601  # both prompts, and the newline between them


def test_arrivals_are_counted_per_model_and_only_when_a_policy_reads_them() -> None:
    infos = RequestInfos(prefix_block_tokens=64, arrivals=ArrivalCounts())
    assert infos.build(incoming({"prompt": "hi"}), hashed=False).arrival_rate == 0.0
    for _ in range(3):
        counted = infos.build(incoming({"prompt": "hi"}), hashed=False, counted=True)
    # the first counted request only starts the clock: three counted within one
    # second read as one between the first and the last, a rate of at least 1/s
    assert counted.arrival_rate > 0.5
    other = Incoming({}, "/v1/completions", b"", {"prompt": "hi"}, [], "other", "rid", 0.0)
    assert infos.build(other, hashed=False, counted=True).arrival_rate == 0.0
    # the other replicas' rate for the model, heard through the store, is added
    infos.arrivals.heard({"other": 4.0})
    assert infos.build(other, hashed=False, counted=True).arrival_rate >= 4.0
    assert infos.build(other, hashed=False).arrival_rate == 0.0
