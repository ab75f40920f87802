"""Prompt text, token estimates and prefix block hashes.

The gateway and the emulated workers both use these, so a prefix the gateway
believes a backend holds is the prefix the worker actually caches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate: four characters a token, at least one."""
    return max(1, (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def prompt_text(body: Mapping[str, Any]) -> str:
    """All prompt text of a chat, completion or embedding body: messages, or a batch's
    prompts (an embedding's inputs), joined by newlines."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return "\n".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))
    prompts = body.get("prompt")
    if prompts is None:
        prompts = body.get("input")
    return "\n".join(completion_prompts(prompts) or ())


def completion_prompts(prompt: Any) -> list[str] | None:
    """A completion's prompts as text (`prompt_parts`, token ids spelled by
    `ids_text`); None for anything vLLM would not take."""
    parts = prompt_parts(prompt)
    if parts is None:
        return None
    return [p if isinstance(p, str) else ids_text(p) for p in parts]


def prompt_parts(prompt: Any) -> list[str] | list[list[int]] | None:
    """A completion's prompts, as vLLM takes them: a string, a list of strings, a list
    of token ids (one prompt) or a list of such lists (a batch); None for anything
    else. Checking costs a scan of the ids at C speed, not a call per id."""
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        return None
    if _ids(prompt):
        return [prompt]
    if all(isinstance(p, str) for p in prompt) or all(_ids(p) for p in prompt):
        return prompt
    return None


_ID_LIMIT = 36**CHARS_PER_TOKEN  # past every tokenizer's vocabulary
_DIGITS = np.frombuffer(b"0123456789abcdefghijklmnopqrstuvwxyz", np.uint8)
_PLACES = 36 ** np.arange(CHARS_PER_TOKEN - 1, -1, -1)


def _ids(p: Any) -> bool:
    """A non-empty list of token ids: ints (not bools) in [0, _ID_LIMIT)."""
    return (
        isinstance(p, list)
        and bool(p)
        and set(map(type, p)) == {int}
        and min(p) >= 0
        and max(p) < _ID_LIMIT
    )


def ids_text(ids: list[int]) -> str:
    """Token ids as text of CHARS_PER_TOKEN base-36 digits each: the token estimate
    counts one token per id, and prefix blocks fall on the same ids as the engine's."""
    digits = np.asarray(ids, np.int64)[:, None] // _PLACES % 36
    text: str = _DIGITS[digits].tobytes().decode("ascii")
    return text


def last_user_text(body: Mapping[str, Any]) -> str:
    """The last user message (or the completion prompt): what a data set's prompt matches."""
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in reversed(messages):
            if isinstance(m, dict) and m.get("role") == "user":
                return _content_text(m.get("content"))
        return ""
    return prompt_text(body)


def block_hashes(text: str, block_tokens: int, limit: int = 1024) -> tuple[int, ...]:
    """Chained hashes of the prompt's full blocks, as a prefix cache keys them.

    Block i's hash covers blocks 0..i, so equal hashes mean equal prefixes.
    Stable across processes (unlike `hash()`), so replicas and workers agree.
    """
    size = block_tokens * CHARS_PER_TOKEN
    out: list[int] = []
    prev = b""
    for start in range(0, min(len(text) // size, limit) * size, size):
        digest = hashlib.blake2b(prev + text[start : start + size].encode(), digest_size=8).digest()
        out.append(int.from_bytes(digest, "little"))
        prev = digest
    return tuple(out)


def stable_hash(value: str) -> int:
    """A 64-bit hash that every process computes alike."""
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "little")
