"""What an answer's choices hold beyond plain text, as vLLM returns it: `n` choices,
`logprobs` with their top alternatives, a required tool call, and JSON output that
matches `response_format`.

Everything is decided from the request's seed before the engine paces the tokens:
choice `i` is drawn from `seed + i`, so that choice 0 of an `n=1` request is the
answer the worker always gave. Tool calls and JSON are generated as JSON text and
split into tokens, so `max_tokens` cuts them where it would cut a model's output.
"""

from __future__ import annotations

import math
import random
import re
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from workers.textgen import VOCAB, generate, truncate_at_stop

MAX_N = 16  # more choices than this is a mistake, not a workload
MAX_TOP_LOGPROBS = 20  # OpenAI's and vLLM's default bound


class Invalid(ValueError):
    """A request field that vLLM would refuse with a 400."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Asked:
    """What the request asked of its choices."""

    n: int = 1
    logprobs: int | None = None  # None: none; k: the chosen token and k alternatives
    tool: str | None = None  # the function a call is required to, by name
    tool_schema: dict[str, Any] | None = None  # that function's parameters
    json_schema: dict[str, Any] | None = None  # the content must be JSON matching this
    ignore_eos: bool = False  # vLLM's extra: generate until max_tokens (trace replay)


def read_asked(body: dict[str, Any], chat: bool) -> Asked:
    """The fields of `body` this module answers, checked as vLLM checks them."""
    n = body.get("n", 1)
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise Invalid(f"'n' must be an integer from 1 to {MAX_N}", "n")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise Invalid("'ignore_eos' must be a boolean", "ignore_eos")
    return Asked(n, _logprobs(body, chat), *_tool(body), _json_schema(body), ignore_eos)


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    if chat:
        wanted = body.get("logprobs")
        top = body.get("top_logprobs")
        if wanted not in (None, True, False):
            raise Invalid("'logprobs' must be a boolean", "logprobs")
        if top is not None and (
            isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS
        ):
            raise Invalid(
                f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}", "top_logprobs"
            )
        if top and not wanted:
            raise Invalid("'top_logprobs' needs 'logprobs' set to true", "top_logprobs")
        return (top or 0) if wanted else None
    k = body.get("logprobs")
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOGPROBS:
        raise Invalid(f"'logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}", "logprobs")
    return k


def _tool(body: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """The function a call is required to, when `tool_choice` requires one."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise Invalid("'tool_choice' needs 'tools'", "tool_choice")
        return None, None
    if not isinstance(tools, list) or not tools:
        raise Invalid("'tools' must be a non-empty list", "tools")
    functions: dict[str, dict[str, Any]] = {}
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if tool.get("type") != "function" or not isinstance(name, str) or not name:
            raise Invalid(
                "each tool must be {'type': 'function', 'function': {name, ...}}", "tools"
            )
        params = fn.get("parameters") or {"type": "object", "properties": {}}  # type: ignore[union-attr]
        functions[name] = params if isinstance(params, dict) else {}
    if choice in (None, "none", "auto"):
        # A model asked to choose answers in text here: the emulator has no reason to call.
        return None, None
    if choice == "required":
        name = next(iter(functions))
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in functions:
            raise Invalid(f"'tool_choice' names {name!r}, which is not in 'tools'", "tool_choice")
    else:
        raise Invalid(
            "'tool_choice' must be 'none', 'auto', 'required' or a named function",
            "tool_choice",
        )
    return name, functions[name]


def _json_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object", "properties": {"answer": {"type": "string"}}}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise Invalid(
                "'response_format.json_schema.schema' must be an object", "response_format"
            )
        return schema
    raise Invalid(
        "'response_format.type' must be 'text', 'json_object' or 'json_schema'", "response_format"
    )


@dataclass(slots=True)
class Choice:
    """One choice's tokens, decided before the engine paces them."""

    index: int
    pieces: list[str]  # the tokens this choice emits
    finish: str  # its finish_reason if every piece is emitted
    seed: int
    tool_call_id: str | None = None  # set when the pieces are a tool call's arguments


def plan(asked: Asked, seed: int, natural: int, limit: int | None, stop: list[str]) -> list[Choice]:
    """The request's choices. `natural`: the answer's own length in tokens; `limit`:
    the most it may have (max_tokens and the context window)."""
    if asked.ignore_eos and limit is not None:
        natural = limit
    out = []
    for i in range(asked.n):
        s = seed + i
        schema = asked.tool_schema if asked.tool is not None else asked.json_schema
        if schema is not None:
            full = tokens_of(orjson.dumps(value_for(schema, random.Random(s))).decode())
            cut = full if limit is None else full[:limit]
            done = len(cut) == len(full)
            finish = ("tool_calls" if asked.tool else "stop") if done else "length"
            call_id = f"chatcmpl-tool-{uuid.UUID(int=random.Random(s).getrandbits(128)).hex}"
            out.append(Choice(i, cut, finish, s, call_id if asked.tool else None))
            continue
        want = natural if limit is None else min(limit, natural)
        pieces = generate(s, want)
        emit, stopped = truncate_at_stop(pieces, stop)
        out.append(Choice(i, pieces[:emit], "stop" if stopped or want == natural else "length", s))
    return out


_TOKEN = re.compile(r"\s?[A-Za-z]+|\s?\d{1,3}|\s+|.", re.S)


def tokens_of(text: str) -> list[str]:
    """`text` split the way a BPE tokenizer roughly would: words, short digit runs,
    punctuation."""
    return _TOKEN.findall(text)


def value_for(schema: dict[str, Any], rng: random.Random, depth: int = 0) -> Any:
    """A value that matches `schema` (the JSON Schema subset tools and structured
    outputs use: types, properties, required, items, enum, const, anyOf/oneOf)."""
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options and isinstance(options[0], dict):
            return value_for(options[0], rng, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") or {}
        if depth > 6 or not isinstance(props, dict):
            return {}
        return {k: value_for(v, rng, depth + 1) for k, v in props.items() if isinstance(v, dict)}
    if kind == "array":
        items = schema.get("items")
        items = items if isinstance(items, dict) else {}
        low = int(schema.get("minItems", 1))
        high = max(low, min(int(schema.get("maxItems", 3)), low + 3))
        return [value_for(items, rng, depth + 1) for _ in range(rng.randint(low, high))]
    if kind == "integer":
        low, high = int(schema.get("minimum", 0)), int(schema.get("maximum", 100))
        return rng.randint(low, max(low, high))
    if kind == "number":
        bottom, top = float(schema.get("minimum", 0.0)), float(schema.get("maximum", 100.0))
        return round(rng.uniform(bottom, max(bottom, top)), 3)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    words = rng.choices(VOCAB[:-3], k=rng.randint(1, 4))
    text = "".join(words).strip()
    low = int(schema.get("minLength", 0))
    return (text + "x" * low)[: max(low, int(schema.get("maxLength", 10_000)))]


# -- logprobs ----------------------------------------------------------------------


def _alternatives(choice: Choice, i: int, k: int) -> tuple[float, list[tuple[str, float]]]:
    """Token `i`'s logprob and its `k` alternatives' (the chosen one first, as the most
    likely), drawn from the choice's seed: probabilities in (0, 1] that sum to at most 1."""
    rng = random.Random(choice.seed * 1_000_003 + i)
    p = 0.35 + 0.64 * rng.random()
    chosen = math.log(p)
    rest, share = [], 1.0 - p
    others = [t for t in rng.sample(VOCAB, min(len(VOCAB), k + 1)) if t != choice.pieces[i]]
    for token in others[:k]:
        share *= 0.3 + 0.4 * rng.random()
        rest.append((token, math.log(max(share, 1e-12))))
    return chosen, rest


def logprobs(choice: Choice, start: int, end: int, k: int, chat: bool) -> dict[str, Any]:
    """The `logprobs` object of tokens `start` to `end` of `choice`, in the chat or the
    completions shape."""
    tokens = choice.pieces[start:end]
    drawn = [_alternatives(choice, i, k) for i in range(start, end)]
    if chat:
        content = []
        for token, (lp, alts) in zip(tokens, drawn, strict=True):
            top = [(token, lp), *alts][: max(k, 0)] if k else []
            content.append(
                {
                    "token": token,
                    "logprob": lp,
                    "bytes": list(token.encode()),
                    "top_logprobs": [
                        {"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top
                    ],
                }
            )
        return {"content": content}
    offset = len("".join(choice.pieces[:start]))
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [lp for lp, _ in drawn],
        "top_logprobs": [
            dict([(t, lp), *alts][: k or 1]) for t, (lp, alts) in zip(tokens, drawn, strict=True)
        ],
        "text_offset": offsets,
    }


def tool_calls(asked: Asked, choice: Choice, arguments: str) -> list[dict[str, Any]]:
    """A whole answer's `tool_calls`."""
    return [
        {
            "id": choice.tool_call_id,
            "type": "function",
            "function": {"name": asked.tool, "arguments": arguments},
        }
    ]
