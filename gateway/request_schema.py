"""The OpenAI endpoints the gateway forwards and the request bodies each accepts, as
one schema: the OpenAPI document (`Endpoint.openapi`) and the checks (`validate`)
both come from the rules below.

The gateway forwards the client's own bytes; the checks only reject what is
malformed, and unknown fields pass through.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gateway.errors import GatewayError
from policies.text import prompt_parts

MAX_TOKENS_LIMIT = 1 << 24

# A check returns None when the value is acceptable, else the client's message.
Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class Rule:
    """One top-level field: its OpenAPI schema and the check that matches it."""

    name: str
    schema: dict[str, Any]
    check: Check
    required: bool = False


def _string(name: str, message: str) -> Rule:
    def check(v: Any) -> str | None:
        return None if isinstance(v, str) and v else message

    return Rule(name, {"type": "string", "minLength": 1}, check)


def _plain(name: str, kind: str, typ: type) -> Rule:
    message = f"'{name}' must be a{'n' if kind[0] in 'aeio' else ''} {kind}"

    def check(v: Any) -> str | None:
        return None if isinstance(v, typ) and not (typ is int and isinstance(v, bool)) else message

    return Rule(name, {"type": kind}, check)


def _integer(name: str, low: int, high: int) -> Rule:
    message = f"'{name}' must be an integer in [{low}, {high}]"

    def check(v: Any) -> str | None:
        ok = isinstance(v, int) and not isinstance(v, bool) and low <= v <= high
        return None if ok else message

    return Rule(name, {"type": "integer", "minimum": low, "maximum": high}, check)


def _number(name: str, low: float, high: float) -> Rule:
    message = f"'{name}' must be a number in [{low}, {high}]"

    def check(v: Any) -> str | None:
        ok = (
            isinstance(v, int | float)
            and not isinstance(v, bool)
            and math.isfinite(v)
            and low <= v <= high
        )
        return None if ok else message

    return Rule(name, {"type": "number", "minimum": low, "maximum": high}, check)


def _stop(v: Any) -> str | None:
    if isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)):
        return None
    return "'stop' must be a string or a list of strings"


def _messages(v: Any) -> str | None:
    if not isinstance(v, list) or not v:
        return "'messages' must be a non-empty list"
    for m in v:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return "each message needs a string 'role'"
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            return "message 'content' must be a string or a list"
    return None


def _texts(name: str) -> Rule:
    """A completion's `prompt` or an embedding's `input`: a string, a list of strings
    or of token ids, or a batch of lists of ids (`prompt_parts`)."""
    message = (
        f"'{name}' must be a string, a non-empty list of strings or of token ids "
        "(integers from 0), or a list of such lists of token ids"
    )

    def check(v: Any) -> str | None:
        return None if prompt_parts(v) is not None else message

    ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
    schema = {
        "oneOf": [
            {"type": "string"},
            {"type": "array", "minItems": 1, "items": {"type": "string"}},
            ids,
            {"type": "array", "minItems": 1, "items": ids},
        ]
    }
    return Rule(name, schema, check, required=True)


def _not_streamed(v: Any) -> str | None:
    return None if v is False else "embeddings are not streamed: 'stream' must be false"


_MODEL = replace(_string("model", "'model' is required and must be a string"), required=True)

_COMMON = (
    _MODEL,
    _plain("stream", "boolean", bool),
    _plain("stream_options", "object", dict),
    _integer("max_tokens", 1, MAX_TOKENS_LIMIT),
    _integer("max_completion_tokens", 1, MAX_TOKENS_LIMIT),
    _integer("n", 1, 128),
    _number("temperature", 0.0, 2.0),
    _number("top_p", 0.0, 1.0),
    Rule(
        "stop",
        {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        _stop,
    ),
    _plain("user", "string", str),
    _plain("seed", "integer", int),
)

CHAT_RULES = (
    *_COMMON,
    Rule(
        "messages",
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"type": "string"},
                    "content": {"oneOf": [{"type": "string"}, {"type": "array"}]},
                },
            },
        },
        _messages,
        required=True,
    ),
)

COMPLETION_RULES = (*_COMMON, _texts("prompt"))


# What /v1/embeddings takes, vLLM's way: `input` as a completion's `prompt`.
EMBEDDING_RULES = (
    _MODEL,
    _texts("input"),
    Rule(
        "encoding_format",
        {"type": "string", "enum": ["float", "base64"]},
        lambda v: None if v in ("float", "base64") else "'encoding_format' must be float or base64",
    ),
    _integer("dimensions", 1, 1 << 16),
    _plain("user", "string", str),
    Rule("stream", {"type": "boolean", "enum": [False]}, _not_streamed),
)


@dataclass(frozen=True, eq=False)  # one of each: compared and hashed by identity
class Endpoint:
    """An OpenAI endpoint the gateway forwards: its path, the rules of its body, and
    whether it generates tokens (only then may its answer stream, and only then is
    there a decode to split from the prefill)."""

    path: str
    rules: tuple[Rule, ...]
    generates: bool = True

    @property
    def openapi(self) -> dict[str, Any]:
        return openapi_body(self.rules)


CHAT = Endpoint("/v1/chat/completions", CHAT_RULES)
COMPLETIONS = Endpoint("/v1/completions", COMPLETION_RULES)
EMBEDDINGS = Endpoint("/v1/embeddings", EMBEDDING_RULES, generates=False)
ENDPOINTS = {e.path: e for e in (CHAT, COMPLETIONS, EMBEDDINGS)}


def validate(body: Any, endpoint: Endpoint) -> dict[str, Any]:
    """`body` if it is an object whose known fields follow the endpoint's rules; else a
    400 naming the first field that does not."""
    if not isinstance(body, dict):
        raise GatewayError(400, "the request body must be a JSON object")
    for rule in endpoint.rules:
        v = body.get(rule.name)
        if v is None:
            if rule.required:
                raise GatewayError(400, rule.check(v) or "", param=rule.name)
            continue
        problem = rule.check(v)
        if problem is not None:
            raise GatewayError(400, problem, param=rule.name)
    return body


def openapi_body(rules: tuple[Rule, ...]) -> dict[str, Any]:
    """The `requestBody` of an OpenAPI operation for these rules."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": [r.name for r in rules if r.required],
                        "properties": {r.name: r.schema for r in rules},
                        "additionalProperties": True,
                    }
                }
            },
        }
    }
