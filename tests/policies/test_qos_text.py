"""The QoS predictors' prompt ids: the committed predictors were trained on these ids,
so any rewrite of `gram_ids` must keep them."""

from __future__ import annotations

import itertools
import random
import re
import zlib

import numpy as np

from policies.qos_text import MAX_IDS, VOCAB, gram_ids, hashed_ids


def reference(text: str, max_ids: int = MAX_IDS) -> np.ndarray:
    """The ids as the committed predictors were trained on them (str words, each gram's
    UTF-8 hashed), written out apart from the code that computes them."""
    words = re.findall(r"[a-z0-9]+|[^\sa-z0-9]", text.lower())[: max_ids // 2]
    grams = words + [a + " " + b for a, b in itertools.pairwise(words)]
    found = np.array([zlib.crc32(g.encode()) for g in grams[:max_ids]], np.int64)
    return 1 + found % (VOCAB - 1)


def test_ids_are_the_trained_ones_for_ascii_control_and_unicode_text() -> None:
    rng = random.Random(0)
    alphabet = [chr(i) for i in range(128)] + list("éÉßİ\u00a0\u2003中文ﬁ😀")
    texts = ["", " ", "\x1c\x1f", "Write a python function.", "a\x1cb\x1dc", "İstanbul ﬁne"]
    texts += ["".join(rng.choices(alphabet[:128], k=rng.randint(0, 600))) for _ in range(200)]
    texts += ["".join(rng.choices(alphabet, k=rng.randint(0, 600))) for _ in range(200)]
    for text in texts:
        for max_ids in (MAX_IDS, 7):
            got = gram_ids(text, max_ids)
            assert got.dtype == np.int64
            assert got.tolist() == reference(text, max_ids).tolist(), repr(text)
    assert ((gram_ids("x " * 1000) >= 1) & (gram_ids("x " * 1000) < VOCAB)).all()


def test_long_prompts_give_the_ids_of_their_whole_text() -> None:
    """Only a prefix of a long prompt is read: where it is cut must not change a word,
    nor how a capital sigma before the cut is lower-cased (final or not, by what
    follows it in the whole text)."""
    rng = random.Random(1)
    pieces = ["word", "ΣΑΣ", "Σ.", "Σ.a", "Σ'", "İ", "x" * 300, "a.b", "\n", "  ", "!", "中文"]
    texts = ["Σ" * 5000, "ab " * 3000 + "Σ", ("x" * 40 + "\n") * 400]
    texts += [" ".join(rng.choices(pieces, k=rng.randint(100, 3000))) for _ in range(100)]
    texts += ["".join(rng.choices(pieces, k=rng.randint(100, 3000))) for _ in range(100)]
    for text in texts:
        for max_ids in (MAX_IDS, 7, 2000):
            assert gram_ids(text, max_ids).tolist() == reference(text, max_ids).tolist()


def test_padded_ids() -> None:
    ids = hashed_ids("two words")
    assert ids.shape == (MAX_IDS,) and ids[:3].tolist() == gram_ids("two words").tolist()
    assert not ids[3:].any()
