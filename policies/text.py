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


def prompt_parts(prompt: Any) -> list[str] | list[np.ndarray] | None:
    """A completion's prompts, as vLLM takes them: a string, a list of strings, a list
    of token ids (one prompt) or a list of such lists (a batch), the ids as arrays;
    None for anything else."""
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        return None
    one = token_ids(prompt)
    if one is not None:
        return [one]
    if all(isinstance(p, str) for p in prompt):
        return prompt
    batch = [token_ids(p) for p in prompt]
    found = [ids for ids in batch if ids is not None]
    return found if len(found) == len(batch) else None


_ID_LIMIT = 36**CHARS_PER_TOKEN  # past every tokenizer's vocabulary


def token_ids(p: Any) -> np.ndarray | None:
    """`p` as an int64 array if it is a non-empty list of token ids: ints (not bools)
    in [0, _ID_LIMIT); else None. Costs two passes over the list at C speed, not a
    call per id."""
    if not isinstance(p, list) or not p or set(map(type, p)) != {int}:
        return None
    try:
        ids = np.fromiter(p, np.int64, len(p))
    except OverflowError:  # past int64
        return None
    return ids if ids.min() >= 0 and ids.max() < _ID_LIMIT else None


# Every pair of base-36 digits, as the two ASCII bytes of one uint16, by its value:
# an id's four digits are two pairs (CHARS_PER_TOKEN).
_DIGITS = np.frombuffer(b"0123456789abcdefghijklmnopqrstuvwxyz", np.uint8)
_PAIRS = (
    np.stack(np.meshgrid(_DIGITS, _DIGITS, indexing="ij"), -1)  # [36, 36, 2] bytes
    .view(np.uint16)  # [36, 36, 1]
    .ravel()  # by the pair's value, 36 x first digit + second
)


def ids_text(ids: np.ndarray | list[int]) -> str:
    """Token ids (in [0, _ID_LIMIT)) as text of CHARS_PER_TOKEN base-36 digits each:
    the token estimate counts one token per id, and prefix blocks fall on the same ids
    as the engine's."""
    ids = np.asarray(ids, np.int64)
    high = ids // 36**2
    out = np.empty((len(ids), 2), np.uint16)
    out[:, 0] = _PAIRS[high]
    out[:, 1] = _PAIRS[ids - high * 36**2]
    return out.tobytes().decode("ascii")


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
