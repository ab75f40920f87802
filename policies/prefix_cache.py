"""A backend's prefix cache: the prompt blocks it holds, keyed by chained block hashes
(`policies.text.block_hashes`: equal hashes mean equal prefixes), at most `blocks` of
them, the least recently used first out. A prompt whose leading blocks are cached
skips their prefill, all but its last token, which yields the first output token.

One structure for three holders: the emulated worker's engine keeps its own cache with
it (`workers.engine`, as vLLM's automatic prefix caching), the QoS simulator's experts
keep theirs (`edgeroute.sim.edge`, so a prompt's prefill costs what it costs on the
worker), and the gateway keeps, per backend, the blocks it has sent there, its guess at
that backend's cache (`gateway.backends`, read by the prefix-aware scorers).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import KeysView, Sequence


class PrefixCache:
    def __init__(self, blocks: int) -> None:
        self.capacity = blocks
        self._hashes: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hashes)

    def blocks(self) -> KeysView[int]:
        """The blocks held: a live, read-only view."""
        return self._hashes.keys()

    def hit(self, hashes: Sequence[int]) -> int:
        """How many of a prompt's leading blocks (by their hashes) are held."""
        blocks = 0
        for h in hashes:
            if h not in self._hashes:
                break
            blocks += 1
        return blocks

    def remember(self, hashes: Sequence[int]) -> None:
        """A prompt's blocks, seen now: the most recently used, older ones evicted past
        the capacity."""
        cache = self._hashes
        for h in hashes:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self.capacity:
            cache.popitem(last=False)


def skipped(cached: int, context: int) -> int:
    """The prefill tokens a sequence of `context` tokens skips with `cached` of them
    cached: all but the last, which is always computed."""
    return max(0, min(cached, context - 1))
