"""Deterministic emulated text: the same seed gives the same tokens."""

from __future__ import annotations

import random

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "at",
    "from",
    "or",
    "an",
    "model",
    "data",
    "token",
    "cache",
    "batch",
    "layer",
    "expert",
    "route",
    "queue",
    "memory",
    "request",
    "stream",
    "answer",
    "value",
    "result",
    "system",
    "network",
    "latency",
    "prompt",
    "decode",
    "prefill",
    "server",
    "edge",
    "first",
    "second",
    "next",
    "last",
    "each",
    "every",
    "some",
    "many",
    "more",
    "most",
    "other",
    "such",
    "only",
    "also",
    "can",
    "will",
    "may",
    "should",
    "would",
    "could",
    "must",
    "use",
    "make",
    "take",
    "give",
    "find",
    "show",
    "keep",
    "run",
    "time",
    "step",
    "block",
    "path",
    "node",
    "link",
    "rate",
    "load",
    "score",
    "length",
    "state",
    "graph",
    "policy",
    "good",
    "fast",
    "slow",
    "high",
    "low",
    "new",
    "old",
    "small",
    "large",
    "long",
    "short",
    "real",
    "same",
    "different",
    "because",
    "when",
    "where",
    "which",
    "while",
    "after",
    "before",
    "then",
    "so",
    "if",
    "not",
    "no",
    "yes",
    "all",
    "any",
]
VOCAB = (*tuple(" " + w for w in _WORDS), ".", ",", "\n")


def generate(seed: int, n: int) -> list[str]:
    """`n` token strings for `seed`."""
    return random.Random(seed).choices(VOCAB, k=n)


def truncate_at_stop(tokens: list[str], stop: list[str]) -> tuple[int, bool]:
    """How many tokens to emit before the first stop string, and whether one was hit.

    As in vLLM, the stop string itself is not returned; the tokens before the
    one that completes it are.
    """
    if not stop:
        return len(tokens), False
    text = ""
    for i, tok in enumerate(tokens):
        text += tok
        if any(s in text for s in stop):
            return i, True
    return len(tokens), False
