"""An engine's prefix cache, as vLLM's automatic prefix caching keeps one: the prompt
blocks it has computed, keyed by chained block hashes (`policies.text.block_hashes`:
equal hashes mean equal prefixes), as many as its KV cache has blocks, the least
recently used first out. A sequence whose leading blocks are cached skips their
prefill, all but the prompt's last token, which yields the first output token.

The emulated worker's engine (`workers.engine`) and the QoS simulator's experts
(`edgeroute.sim.edge`) keep theirs with this one class, so a request's prefill costs
the same in both.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    def __init__(self, blocks: int, block_size: int) -> None:
        self.blocks, self.block_size = blocks, block_size
        self._hashes: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hashes)

    def hit(self, hashes: Sequence[int]) -> int:
        """How many tokens of a prompt with these block hashes are cached: its leading
        blocks that are, in tokens."""
        blocks = 0
        for h in hashes:
            if h not in self._hashes:
                break
            blocks += 1
        return blocks * self.block_size

    def remember(self, hashes: Sequence[int]) -> None:
        """A prompt's blocks, computed now: the most recently used, older ones evicted
        past the capacity."""
        cache = self._hashes
        for h in hashes:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self.blocks:
            cache.popitem(last=False)


def skipped(cached: int, context: int) -> int:
    """The prefill tokens a sequence of `context` tokens skips with `cached` of them
    cached: all but the last, which is always computed."""
    return max(0, min(cached, context - 1))
