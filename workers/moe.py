"""Expert-activation model for MoE worker emulation, calibrated from real routing data.

`shared/data/moe_routing/` holds real Mixtral-8x7B top-2 selections (per task, layer and
token; 585 tokens over GSM8K and HumanEval). From it:

- Mixtral tasks `gsm8k` and `humaneval`: each layer's selection counts, with a light
  Dirichlet prior (alpha = 1 per expert), are that layer's activation distribution.
- Other tasks keep the measured skew but not the measured identities: task k uses the
  measured layer distributions with experts relabelled by a per-task permutation
  (seeded by the task name), so different tasks prefer different experts.
- Mixtral tasks with per-token records (`*_routing.jsonl.gz`) can also be replayed
  token by token (`real_sequences`): real selections, with their real correlation
  across layers and consecutive tokens.
- Shapes with more experts (DeepSeek-V2-Lite: 26 layers x 64 experts, top-6) draw each
  layer from a symmetric Dirichlet whose concentration is fitted so that the mean
  normalised entropy matches the one measured on Mixtral.

Per token and layer, `top_k` distinct experts are drawn (Gumbel top-k).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from policies.prism import entropy

COUNTS_FILE = "mixtral8x7b_expert_counts_by_task_layer.csv"


@dataclass(frozen=True)
class MoEShape:
    name: str
    layers: int
    experts: int
    top_k: int


MIXTRAL = MoEShape("mixtral-8x7b", 32, 8, 2)
DEEPSEEK_V2_LITE = MoEShape("deepseek-v2-lite", 26, 64, 6)
SHAPES = {s.name: s for s in (MIXTRAL, DEEPSEEK_V2_LITE)}


def read_counts(data_dir: Path) -> dict[str, np.ndarray]:
    """task -> [layers, experts] selection counts."""
    out: dict[str, list[list[float]]] = {}
    with open(data_dir / "moe_routing" / COUNTS_FILE, newline="") as fh:
        for row in csv.DictReader(fh):
            experts = sorted(k for k in row if k.startswith("expert_"))
            out.setdefault(row["task"], []).append([float(row[k]) for k in experts])
    return {t: np.array(v) for t, v in out.items()}


@lru_cache(maxsize=4)
def real_sequences(data_dir: Path) -> dict[str, tuple[np.ndarray, ...]]:
    """task -> one [tokens, layers, top_k] array of Mixtral's real selections per
    problem, in decode order; tokens missing a layer are left out."""
    found: dict[tuple[str, int], dict[int, dict[int, list[int]]]] = {}
    for path in sorted((data_dir / "moe_routing").glob("*_routing.jsonl.gz")):
        with gzip.open(path, "rt") as fh:
            for line in fh:
                r = json.loads(line)
                per_token = found.setdefault((r["dataset"], r["problem_id"]), {})
                per_token.setdefault(r["token_idx"], {})[r["layer"]] = r["experts"]
    out: dict[str, list[np.ndarray]] = {}
    for (task, _), tokens in sorted(found.items()):
        complete = [
            [layers[la] for la in range(MIXTRAL.layers)]
            for _, layers in sorted(tokens.items())
            if len(layers) == MIXTRAL.layers
        ]
        out.setdefault(task, []).append(np.array(complete, dtype=np.int64))
    return {t: tuple(v) for t, v in out.items()}


def replayed_token(task: str, key: str, index: int, data_dir: Path) -> np.ndarray | None:
    """[layers, top_k]: token `index` of the recorded sequence that `key` (a request
    id) maps to, starting at an offset `key` also picks; None when `task` has no
    records."""
    recorded = real_sequences(data_dir).get(task)
    if not recorded:
        return None
    h = _seed("replay", key)
    seq = recorded[h % len(recorded)]
    token: np.ndarray = seq[(h // len(recorded) + index) % len(seq)]
    return token


def fit_concentration(target_entropy: float, experts: int, rng: np.random.Generator) -> float:
    """Symmetric Dirichlet alpha whose draws have the target mean normalised entropy."""
    lo, hi = 0.01, 100.0
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        h = float(entropy(rng.dirichlet(np.full(experts, mid), 400)).mean())
        lo, hi = (mid, hi) if h < target_entropy else (lo, mid)
    return math.sqrt(lo * hi)


def _seed(*parts: str) -> int:
    return int.from_bytes(
        hashlib.blake2b("/".join(parts).encode(), digest_size=8).digest(), "little"
    )


@lru_cache(maxsize=64)
def task_distribution(shape: MoEShape, task: str, data_dir: Path) -> np.ndarray:
    """[layers, experts] activation probabilities of `task` on `shape`."""
    counts = read_counts(data_dir)
    measured = {t: (c + 1.0) / (c + 1.0).sum(-1, keepdims=True) for t, c in counts.items()}
    rng = np.random.default_rng(_seed(shape.name, task))
    if shape.experts == MIXTRAL.experts and shape.layers == MIXTRAL.layers:
        if task in measured:
            found: np.ndarray = measured[task]
            return found
        base = measured[sorted(measured)[_seed(task) % len(measured)]]
        return np.stack([layer[rng.permutation(shape.experts)] for layer in base])
    target = float(np.mean([entropy(p).mean() for p in measured.values()]))
    alpha = fit_concentration(target, shape.experts, np.random.default_rng(0))
    return rng.dirichlet(np.full(shape.experts, alpha), size=shape.layers)


def sample_token(dist: np.ndarray, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """[layers, top_k] expert ids for one token: Gumbel top-k per layer."""
    g = np.log(dist) + rng.gumbel(size=dist.shape)
    return np.argsort(-g, axis=-1)[:, :top_k]


def activation_counts(
    dist: np.ndarray, top_k: int, tokens: int, rng: np.random.Generator
) -> np.ndarray:
    """[layers, experts] counts over `tokens` tokens."""
    out = np.zeros_like(dist)
    for _ in range(tokens):
        sel = sample_token(dist, top_k, rng)
        np.add.at(out, (np.arange(dist.shape[0])[:, None], sel), 1.0)
    return out


@dataclass(frozen=True)
class CostModel:
    local_expert_s: float = 0.002  # one token through one local expert
    rtt_s: float = 0.001
    hidden_bytes: int = 8192  # the token's activations (4096 x fp16 for Mixtral)
    bandwidth_bps: float = 500e6  # the paper's default emulated link
    remote_load_s: float = 0.002  # host RAM -> GPU and back on the remote server

    @property
    def remote_expert_s(self) -> float:
        return (
            self.rtt_s
            + 2 * self.hidden_bytes * 8 / self.bandwidth_bps
            + self.remote_load_s
            + self.local_expert_s
        )
