"""OpenAPI request-body schemas for the proxied routes.

The proxy reads raw bytes (so unknown fields pass through untouched); these
schemas document what it accepts, for clients and for schema-driven testing.
"""

from __future__ import annotations

from typing import Any

_COMMON: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object"},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 1 << 24},
    "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": 1 << 24},
    "n": {"type": "integer", "minimum": 1, "maximum": 128},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "user": {"type": "string"},
    "seed": {"type": "integer"},
}


def _body(required: list[str], extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": required,
                        "properties": {**_COMMON, **extra},
                        "additionalProperties": True,
                    }
                }
            },
        }
    }


CHAT_BODY = _body(
    ["model", "messages"],
    {
        "messages": {
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
    },
)

COMPLETION_BODY = _body(
    ["model", "prompt"],
    {
        "prompt": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "minItems": 1, "items": {"type": "string"}},
            ]
        },
    },
)
