"""Write models/qos/MODEL_CARD.md from a training record and the benchmark results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_card(
    model_dir: Path,
    training: dict[str, Any],
    bench: dict[str, Any] | None,
    variant_dirs: dict[str, str],
) -> None:
    cfg = training["config"]
    lines = [
        "# QoS-DRL router: model card",
        "",
        "- Files: `actor.onnx` (HAN encoder + actor head, one graph, inputs as in "
        "`policies/qos_state.py`), `predictor.onnx` + `predictor.json` (score and length "
        "buckets, hashed bag of words).",
        f"- Variant: `{cfg['variant']}`; seed {cfg['seed']}; {cfg['steps']} environment steps "
        f"(one decision each), SAC update every {cfg['update_every']} steps, learning rate "
        f"{cfg['lr']}, target entropy {cfg['target_entropy_ratio']} x log(actions).",
        f"- Command: `edgeroute train qos --variant {cfg['variant']} --steps {cfg['steps']} "
        f"--eval-every {cfg['eval_every']} --seed {cfg['seed']}` "
        f"({training['seconds']:.0f} s on 2 CPU cores).",
        f"- Environment: `sim/edge.py`, N={cfg['experts']} experts (RouterBench models on "
        f"drawn edge hardware), Poisson lambda={cfg['rate']}/s, L={cfg['latency_ms']} ms, "
        "free-form tasks (MBPP) of `shared/data/router_quality/` (RouterBench 0-shot via "
        "RouterDC; research-use data, see that folder's README).",
        f"- Best evaluation (seeds {cfg['eval_seeds']}): average QoS "
        f"{training['best_eval_qos']:.3f}; ONNX parity max |diff| "
        f"{training['onnx_parity_max_abs']:.1e}.",
        "- Baselines on the same evaluation: "
        + ", ".join(f"{k} {v['qos']:.3f}" for k, v in training["baselines"].items())
        + ".",
        "",
        "## Training curve",
        "",
        "| step | eval QoS | latency (ms) | drops |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {h['step']} | {h['qos']:.3f} | {h['latency_ms']:.1f} | {h['drop_rate']:.1%} |"
        for h in training["history"]
    ]
    if bench:
        lines += [
            "",
            "## `edgeroute bench qos` (default setting)",
            "",
            "| policy | QoS | latency (ms) | drops |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['policy']} | {r['qos']:.3f} | {r['latency_ms']:.1f} | {r['drop_rate']:.1%} |"
            for r in bench["results"]
            if r["setting"] == "default"
        ]
        lines += [
            "",
            "Other variants evaluated: "
            + ", ".join(f"{k} ({v})" for k, v in variant_dirs.items())
            + ".",
        ]
    (model_dir / "MODEL_CARD.md").write_text("\n".join(lines) + "\n")


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
