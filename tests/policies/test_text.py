from __future__ import annotations

import random
from typing import Any

from policies.text import (
    block_hashes,
    completion_prompts,
    estimate_tokens,
    ids_text,
    last_user_text,
    prompt_text,
)


def test_prompt_text_of_chat_and_completion_bodies() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ]
    }
    assert prompt_text(chat) == "be brief\nhi"
    assert last_user_text(chat) == "hi"
    assert prompt_text({"prompt": "abc"}) == "abc"
    assert prompt_text({"prompt": ["a", "b"]}) == "a\nb"


def test_estimate_tokens() -> None:
    assert estimate_tokens("") == 1
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2


def test_block_hashes_are_chained_prefix_hashes() -> None:
    a = block_hashes("a" * 64 + "b" * 64 + "c" * 10, 16)
    b = block_hashes("a" * 64 + "b" * 64 + "d" * 70, 16)
    c = block_hashes("z" * 64 + "b" * 64, 16)
    assert len(a) == 2 and a == b[:2]
    assert a[1] != c[1]  # same block, different prefix


def test_token_id_prompts_count_one_token_an_id_and_share_blocks_by_id() -> None:
    ids = list(range(1000, 1300))
    assert estimate_tokens(prompt_text({"prompt": ids})) == 300
    batch = prompt_text({"prompt": [ids, ids[:100]]})
    assert estimate_tokens(batch) == 400 + 1  # and the newline between them
    # 64-token blocks fall on the ids: a prompt sharing the first 130 ids shares 2 blocks
    other = ids[:130] + [7] * 170
    a = block_hashes(prompt_text({"prompt": ids}), 64)
    b = block_hashes(prompt_text({"prompt": other}), 64)
    assert len(a) == len(b) == 4 and a[:2] == b[:2] and a[2] != b[2]


def test_completion_prompts_are_what_vllm_takes() -> None:
    assert completion_prompts("hi") == ["hi"]
    assert completion_prompts(["a", "b"]) == ["a", "b"]
    assert completion_prompts([1, 2]) == [ids_text([1, 2])]
    assert completion_prompts([[1], [2, 3]]) == [ids_text([1]), ids_text([2, 3])]
    assert ids_text([0, 35, 36, 36**4 - 1]) == "0000000z0010zzzz"
    bad: object
    bad_lists: tuple[list[Any], ...] = (
        [],
        [[]],
        [1, "a"],
        [-1],
        [True],
        [1, False],
        [1.0],
        [[1], "a"],
        [[1], [2, None]],
    )
    too_big: tuple[list[Any], ...] = ([36**4], [1 << 63], [1 << 100], [[1], [-(1 << 64)]])
    for bad in (*bad_lists, *too_big, {"a": 1}, None):
        assert completion_prompts(bad) is None, bad


def test_token_ids_are_spelled_as_four_base_36_digits() -> None:
    def spelled(i: int) -> str:
        return "".join(
            "0123456789abcdefghijklmnopqrstuvwxyz"[i // 36**k % 36] for k in (3, 2, 1, 0)
        )

    rng = random.Random(0)
    ids = [0, 1, 35, 36, 36**2 - 1, 36**2, 36**3, 36**4 - 1]
    ids += [rng.randrange(36**4) for _ in range(3000)]
    assert ids_text(ids) == "".join(map(spelled, ids))
    assert completion_prompts(ids) == ["".join(map(spelled, ids))]
