"""Request traces, in any file of three public formats (optionally gzipped):

- Mooncake JSONL: `timestamp` (ms), `input_length`, `output_length` and `hash_ids`,
  one per 512-token block; the same hash is the same block of prompt, so prefix
  caches can hit;
- the Azure LLM inference CSV: `TIMESTAMP`, `ContextTokens`, `GeneratedTokens`; no
  block hashes, so every prompt is its own;
- a RouterBench-style prompt set (CSV with `prompt` and `eval_name` columns, the
  prompt as a Python list literal or plain text): real prompts and their task, no
  times and no output lengths. Arrivals are a Poisson process at one per second,
  drawn once (the same for every reader), and the output length is the answering
  model's own (`output_len` 0).
"""

from __future__ import annotations

import csv
import gzip
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

MOONCAKE_BLOCK = 512


@dataclass(frozen=True)
class TraceRequest:
    t: float  # seconds from the first request
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]
    prompt: str = ""  # the real prompt, when the trace has one
    task: str = ""


TraceKind = Literal["mooncake", "azure", "prompt set"]


def trace_kind(path: Path) -> TraceKind:
    """Which of the three formats `path` holds, told apart by its first line."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        first = fh.readline().strip()
    if first.startswith("{"):
        return "mooncake"
    if "ContextTokens" in first:
        return "azure"
    columns = set(next(csv.reader([first]), []))
    if {"prompt", "eval_name"} <= columns:
        return "prompt set"
    raise ValueError(
        f"{path}: neither a Mooncake JSONL, an Azure CSV trace nor a RouterBench prompt set"
    )


def read_trace(path: Path, kind: TraceKind | None = None) -> list[TraceRequest]:
    """Any file of the three formats (`kind`, when already told, as `trace_kind` tells it)."""
    readers = {"mooncake": read_mooncake, "azure": read_azure, "prompt set": read_prompt_set}
    return readers[kind or trace_kind(path)](path)


def read_prompt_set(path: Path) -> list[TraceRequest]:
    from policies.text import estimate_tokens
    from workers.quality import literal_text

    opener = gzip.open if path.suffix == ".gz" else open
    csv.field_size_limit(1 << 30)
    rng = random.Random(0)
    out = []
    t = 0.0
    with opener(path, "rt", newline="") as fh:
        for row in csv.DictReader(fh):
            prompt = literal_text(row["prompt"])
            if not prompt:
                continue
            out.append(
                TraceRequest(
                    t,
                    estimate_tokens(prompt),
                    0,
                    (),
                    prompt=prompt,
                    task=row.get("eval_name") or "",
                )
            )
            t += rng.expovariate(1.0)
    return out


def read_azure(path: Path) -> list[TraceRequest]:
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", newline="") as fh:
        for row in csv.DictReader(fh):
            stamp = datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp()
            out.append(
                TraceRequest(stamp, int(row["ContextTokens"]), int(row["GeneratedTokens"]), ())
            )
    if not out:
        return out
    t0 = min(r.t for r in out)
    out = [TraceRequest(r.t - t0, r.input_len, r.output_len, r.hash_ids) for r in out]
    out.sort(key=lambda r: r.t)
    return out


def read_mooncake(path: Path) -> list[TraceRequest]:
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt") as fh:
        for line in fh:
            if not line.strip():
                continue
            rec = json.loads(line)
            out.append(
                TraceRequest(
                    rec["timestamp"] / 1000.0,
                    int(rec["input_length"]),
                    int(rec["output_length"]),
                    tuple(int(h) for h in rec.get("hash_ids", ())),
                )
            )
    out.sort(key=lambda r: r.t)
    return out


@dataclass(frozen=True)
class Profile:
    """A workload profile: the trace filtered by input length, with its TTFT SLO."""

    name: str
    min_input: int
    max_input: int
    slo_s: float


PROFILES = {
    "chatbot": Profile("chatbot", 0, 8192, 2.0),
    "rag": Profile("rag", 4096, 32768, 5.0),
    "long": Profile("long", 16384, 1 << 30, 10.0),
}


def select(trace: list[TraceRequest], profile: Profile) -> list[TraceRequest]:
    return [r for r in trace if profile.min_input <= r.input_len <= profile.max_input]


def arrivals(
    requests: list[TraceRequest], rate: float, start: float, duration: float
) -> Iterator[TraceRequest]:
    """Requests of the trace from `start` (trace seconds), their timestamps compressed by a
    single factor to reach `rate` per second, until `duration` simulated seconds."""
    window = [r for r in requests if r.t >= start]
    if not window:
        return
    span = window[-1].t - window[0].t
    native = len(window) / span if span > 0 else rate
    scale = native / rate  # > 1 stretches, < 1 compresses
    t0 = window[0].t
    for r in window:
        t = (r.t - t0) * scale
        if t > duration:
            return
        yield TraceRequest(t, r.input_len, r.output_len, r.hash_ids)


# About four characters per token, as the gateway's and the workers' estimate counts.
CHARS_PER_TOKEN = 4


def prompt_for(req: TraceRequest, unique: int) -> str:
    """A prompt of `req.input_len` tokens. Each hash id is the same 512-token block of
    text wherever it appears, so requests that share hash ids share a prefix; the rest
    (or all of it, without hash ids) is text of this request's own (`unique`)."""
    parts = []
    for block in req.hash_ids:
        parts.append(_block_text(block))
    text = "".join(parts)[: req.input_len * CHARS_PER_TOKEN]
    missing = req.input_len * CHARS_PER_TOKEN - len(text)
    if missing > 0:
        text += _filler(f"request {unique}", missing)
    return text


def _block_text(block: int) -> str:
    return _filler(f"block {block}", MOONCAKE_BLOCK * CHARS_PER_TOKEN)


_WORDS = ("data", "cache", "route", "token", "model", "query", "answer", "plan", "graph", "node")


def _filler(seed: str, chars: int) -> str:
    rng = random.Random(seed)
    out = [f"[{seed}] "]
    size = len(out[0])
    while size < chars:
        word = rng.choice(_WORDS) + " "
        out.append(word)
        size += len(word)
    return "".join(out)[:chars]
