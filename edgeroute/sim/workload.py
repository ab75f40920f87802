"""Mooncake-format traces: any JSONL (optionally gzipped) file with `timestamp` (ms),
`input_length`, `output_length` and `hash_ids` (one per 512-token block)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MOONCAKE_BLOCK = 512


@dataclass(frozen=True)
class TraceRequest:
    t: float  # seconds from the first request
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]


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
