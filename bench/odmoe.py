"""OD-MoE: shadow-model recall by precision and alignment, and what it buys in decoding.

Recall comes from `sim.shadow` (a small random MoE and its quantised shadow, not
Mixtral); decode speed comes from `workers.odmoe`'s pipeline timing with Mixtral-8x7B's
shape (32 layers, 8 experts of 352 MB, top-2) on 8 workers in groups of 2, where each
layer is mispredicted with the measured per-layer miss rate. Fully cached is the same
pipeline with every expert resident (no loads).
"""

from __future__ import annotations

import random
import sys
from typing import Any

from bench.results_io import RESULTS, write
from sim.shadow import ShadowResult, TinyMoE, measure
from workers.odmoe import PipelineConfig, max_load_seconds, token_seconds

MIXTRAL_LAYERS, MIXTRAL_EXPERTS = 32, 8
ALIGNMENTS: dict[str, tuple[int | None, int | None]] = {
    "none": (None, None),
    "token/1": (1, None),
    "kv/1": (None, 1),
    "token+kv/1": (1, 1),
    "token+kv/4": (1, 4),
    "token+kv/16": (1, 16),
}


def decode(cfg: PipelineConfig, layer_miss: float, tokens: int, seed: int) -> float:
    """Mean seconds per token when each layer is mispredicted with `layer_miss`."""
    rng = random.Random(seed)
    total = 0.0
    for _ in range(tokens):
        misses = [rng.random() < layer_miss for _ in range(MIXTRAL_LAYERS)]
        total += token_seconds(cfg, MIXTRAL_LAYERS, misses)
    return total / tokens


def main(quick: bool, seed: int, json_path: str | None) -> list[dict[str, Any]]:
    prompts, tokens = (2, 24) if quick else (4, 64)
    model = TinyMoE()
    alignments = ["none", "token+kv/1"] if quick else list(ALIGNMENTS)
    runs: dict[tuple[str, str], ShadowResult] = {}
    rows: list[dict[str, Any]] = []
    for scheme in ("fp16", "int8", "nf4"):
        for name in alignments:
            print(f"shadow {scheme} alignment {name} ...", file=sys.stderr, flush=True)
            r = measure(model, scheme, *ALIGNMENTS[name], prompts=prompts, tokens=tokens, seed=seed)
            runs[scheme, name] = r
            rows.append(
                {
                    "table": "recall",
                    "shadow": scheme,
                    "alignment": name,
                    "recall": sum(r.recall) / len(r.recall),
                    "last token recall": r.recall[-1],
                    "layer hit": r.layer_hit,
                }
            )

    pipe = PipelineConfig()
    cached = MIXTRAL_LAYERS * (pipe.t_main + pipe.t_worker)
    per_worker_cached = MIXTRAL_LAYERS * MIXTRAL_EXPERTS * pipe.expert_bytes / pipe.workers
    cases = {"fully cached": None, "perfect prediction": 0.0}
    cases |= {
        f"shadow {s}, token+kv/1": 1 - runs[s, "token+kv/1"].layer_hit
        for s in ("fp16", "int8", "nf4")
    }
    cases["no prediction"] = 1.0
    for label, miss in cases.items():
        t = cached if miss is None else decode(pipe, miss, 50 if quick else 400, seed)
        rows.append(
            {
                "table": "decode",
                "case": label,
                "layer miss": 0.0 if miss is None else miss,
                "tokens/s": 1 / t,
                "speed vs cached": cached / t,
                "expert GB per worker": (per_worker_cached if miss is None else pipe.expert_bytes)
                / 1e9,
            }
        )

    recall_rows = [r for r in rows if r["table"] == "recall"]
    decode_rows = [r for r in rows if r["table"] == "decode"]
    write(
        "odmoe",
        {
            "command": "edgeroute bench odmoe" + (" --quick" if quick else ""),
            "shadow_model": vars(model),
            "prompts": prompts,
            "tokens": tokens,
            "seed": seed,
            "pipeline": vars(pipe),
            "eq1_window_s": max_load_seconds(pipe),
            "expert_load_s": pipe.load_seconds,
        },
        recall_rows,
        ["shadow", "alignment", "recall", "last token recall", "layer hit"],
        json_path,
        notes=_notes(decode_rows, pipe),
        quick=quick,
    )
    print("\n" + _notes(decode_rows, pipe))
    if not quick:
        _plot(runs, alignments)
    return rows


def _notes(decode_rows: list[dict[str, Any]], pipe: PipelineConfig) -> str:
    from bench.results_io import table

    return (
        "Recall: a small random MoE (8 layers, 8 experts, top-2) and its quantised shadow,"
        " not Mixtral; levels are not comparable to the paper's 99.94/97.34/95.67%"
        " (fp16/int8/nf4), only the direction of each change.\n\n"
        f"Decode (Mixtral-8x7B shape, {pipe.workers} workers in groups of {pipe.group_size},"
        f" t_M={pipe.t_main * 1e3:.1f} ms, t_W={pipe.t_worker * 1e3:.1f} ms, one expert load"
        f" {pipe.load_seconds * 1e3:.1f} ms, eq. 1 window {max_load_seconds(pipe) * 1e3:.1f} ms;"
        " expert memory only, the main node's dense weights and shadow are not counted):\n\n"
        + table(
            decode_rows,
            ["case", "layer miss", "tokens/s", "speed vs cached", "expert GB per worker"],
        )
    )


def _plot(runs: dict[tuple[str, str], ShadowResult], alignments: list[str]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5), sharey=True)
    for ax, scheme in zip(axes, ("fp16", "int8", "nf4"), strict=True):
        for name in alignments:
            curve = runs[scheme, name].recall
            ax.plot(range(1, len(curve) + 1), curve, label=name)
        ax.set(title=f"{scheme} shadow", xlabel="output token index")
    axes[0].set_ylabel("recall (eq. 2)")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "odmoe_recall.png", dpi=110)
