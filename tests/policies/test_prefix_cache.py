"""The prefix cache the worker's engine, the QoS simulator's experts and the gateway's
backends share."""

from __future__ import annotations

from policies.prefix_cache import PrefixCache, skipped
from policies.text import block_hashes


def test_a_prompt_hits_its_leading_cached_blocks_only() -> None:
    cache = PrefixCache(blocks=100)
    seen = block_hashes("a" * 64 * 4, 16)  # four blocks
    cache.remember(seen)
    assert cache.hit(seen) == 4
    # the same first two blocks, then another text: chained hashes part from there on
    forked = block_hashes("a" * 64 * 2 + "b" * 64 * 2, 16)
    assert forked[:2] == seen[:2] and forked[2:] != seen[2:]
    assert cache.hit(forked) == 2
    # another first block: nothing, even where later blocks' text is the same
    assert cache.hit(block_hashes("b" * 64 + "a" * 64 * 3, 16)) == 0
    assert cache.hit(()) == 0


def test_the_least_recently_used_blocks_go_first_past_the_capacity() -> None:
    cache = PrefixCache(blocks=4)
    a, b, c = (block_hashes(x * 128, 16) for x in "abc")  # two blocks each
    cache.remember(a)
    cache.remember(b)
    cache.remember(a)  # a used again: b is now the oldest
    cache.remember(c)
    assert len(cache) == 4
    assert cache.hit(a) == 2 and cache.hit(c) == 2 and cache.hit(b) == 0
    assert set(cache.blocks()) == {*a, *c}


def test_the_prompts_last_token_is_always_computed() -> None:
    assert skipped(64, 100) == 64
    assert skipped(64, 64) == 63  # all cached: the last still yields the first token
    assert skipped(0, 50) == 0
    assert skipped(16, 1) == 0
