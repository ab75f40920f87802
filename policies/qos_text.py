"""Hashed word and bigram ids of a prompt: the QoS predictors' input, in training and
serving alike (cheap: microseconds per prompt, no tokenizer files)."""

from __future__ import annotations

import re
import zlib

import numpy as np

VOCAB = 1 << 14
MAX_IDS = 256
_WORD = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


def first_words(text: str, n: int) -> list[str]:
    """`text`'s first `n` words and signs, lower-cased: `_WORD.findall(text.lower())[:n]`,
    reading of a long prompt only a prefix that holds them.

    The prefix ends before a space, so its last word is whole and lower-casing it
    gives what lower-casing the whole text gives there (a capital sigma's form depends
    on what follows it, up to the next letter or space). The first prefix tried holds
    `n` words of English prose (about 5 characters and a space each); a text of longer
    words is read again with a prefix four times as long, and so on."""
    size = 8 * n
    while size < len(text):
        cut = text.rfind(" ", 0, size)
        if cut > 0:
            words = _WORD.findall(text[:cut].lower())
            if len(words) >= n:
                return words[:n]
        size *= 4
    return _WORD.findall(text.lower())[:n]


def gram_ids(text: str, max_ids: int = MAX_IDS) -> np.ndarray:
    """Ids in [1, VOCAB) of the first words and bigrams (the CRC-32 of their UTF-8),
    unpadded."""
    words = [w.encode() for w in first_words(text, max_ids // 2)]
    crcs = [zlib.crc32(w) for w in words]
    # A bigram's CRC continues its first word's: no joined string is built.
    crcs += [
        zlib.crc32(b, zlib.crc32(b" ", crc)) for crc, b in zip(crcs[:-1], words[1:], strict=True)
    ]
    return 1 + np.array(crcs[:max_ids], np.int64) % (VOCAB - 1)


def hashed_ids(text: str, max_ids: int = MAX_IDS) -> np.ndarray:
    """`gram_ids` padded with 0 to `max_ids`."""
    found = gram_ids(text, max_ids)
    out = np.zeros(max_ids, np.int64)
    out[: len(found)] = found
    return out
