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
# The same words of an ASCII text, read from its bytes (the request path's common case;
# a sixth faster than the str path): a str pattern's \s also matches \x1c-\x1f, spelled out.
_ASCII_WORD = re.compile(rb"[a-z0-9]+|[^\t\n\x0b\x0c\r\x1c-\x1f a-z0-9]")


def gram_ids(text: str, max_ids: int = MAX_IDS) -> np.ndarray:
    """Ids in [1, VOCAB) of the first words and bigrams (the CRC-32 of their UTF-8),
    unpadded."""
    half = max_ids // 2
    if text.isascii():
        words = _ASCII_WORD.findall(text.encode().lower())[:half]
    else:
        words = [w.encode() for w in _WORD.findall(text.lower())[:half]]
    grams = words + [a + b" " + b for a, b in itertools.pairwise(words)]
    found = np.array(list(map(zlib.crc32, grams[:max_ids])), np.int64)
    return 1 + found % (VOCAB - 1)


def hashed_ids(text: str, max_ids: int = MAX_IDS) -> np.ndarray:
    """`gram_ids` padded with 0 to `max_ids`."""
    found = gram_ids(text, max_ids)
    out = np.zeros(max_ids, np.int64)
    out[: len(found)] = found
    return out
