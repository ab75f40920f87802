"""Hashed word and bigram ids of a prompt: the QoS predictors' input, in training and
serving alike (cheap: microseconds per prompt, no tokenizer files)."""

from __future__ import annotations

import itertools
import re
import zlib

import numpy as np

VOCAB = 1 << 14
MAX_IDS = 256
_WORD = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


def gram_ids(text: str, max_ids: int = MAX_IDS) -> np.ndarray:
    """Ids in [1, VOCAB) of the first words and bigrams (the CRC-32 of their UTF-8),
    unpadded."""
    words = _WORD.findall(text.lower())[: max_ids // 2]
    grams = words + [a + " " + b for a, b in itertools.pairwise(words)]
    found = np.fromiter(map(zlib.crc32, map(str.encode, grams[:max_ids])), np.int64)
    return 1 + found % (VOCAB - 1)


def hashed_ids(text: str, max_ids: int = MAX_IDS) -> np.ndarray:
    """`gram_ids` padded with 0 to `max_ids`."""
    found = gram_ids(text, max_ids)
    out = np.zeros(max_ids, np.int64)
    out[: len(found)] = found
    return out
