"""Just enough of the Prometheus text format to read a backend's engine gauges."""

from __future__ import annotations

from collections.abc import Collection


def read_samples(text: str, names: Collection[str]) -> dict[str, float]:
    """Sum of each wanted metric's samples over all label sets.

    Handles `name value`, `name{labels} value` and an optional trailing timestamp.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace]
            rest = line[line.rfind("}") + 1 :].split()
        else:
            name, _, tail = line.partition(" ")
            rest = tail.split()
        if name not in names or not rest:
            continue
        try:
            out[name] = out.get(name, 0.0) + float(rest[0])
        except ValueError:
            continue
    return out


def _label_set(body: str) -> dict[str, str]:
    """`a="x",b="y"` (the inside of a sample's braces) as a mapping."""
    out = {}
    for part in body.split('",'):
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip().strip('"')
    return out


def read_labels(text: str, name: str) -> dict[str, str]:
    """The labels of the first sample of `name` (for info metrics such as cache_config_info)."""
    prefix = name + "{"
    for line in text.splitlines():
        if line.startswith(prefix):
            return _label_set(line[len(prefix) : line.rfind("}")])
    return {}


def read_by_label(text: str, name: str, label: str) -> dict[str, float]:
    """`name`'s samples keyed by the value of one of their labels."""
    out: dict[str, float] = {}
    prefix = name + "{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        close = line.rfind("}")
        labels = _label_set(line[len(prefix) : close])
        rest = line[close + 1 :].split()
        if label in labels and rest:
            try:
                out[labels[label]] = float(rest[0])
            except ValueError:
                continue
    return out
