"""A small MoE language model trained on CPU, so that OD-MoE's shadow is measured on
learned routing rather than random weights.

Byte-level, decoder-only, the exact architecture `edgeroute.sim.shadow.Decoder` runs
(pre-norm attention without positions, a top-k MoE feed-forward, tied embeddings).
The corpus is real text in the data folder: GSM8K questions with Mixtral-8x7B's and
GPT-4's answers (RouteLLM) and MBPP prompts with eleven models' answers (RouterBench's
train split). Every tenth GSM8K question and the whole MBPP test split are held out:
the shadow is evaluated on prompts the model never trained on.

Training adds the Switch Transformer load-balancing loss so that routing spreads over
the experts (Mixtral's measured shares are 12-13% each), checkpoints every
`checkpoint_every` steps and resumes from the last checkpoint.
"""

from __future__ import annotations

import csv
import gzip
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from edgeroute.sim.shadow import TinyMoE, init_weights

MODEL = TinyMoE(vocab=256, dim=128, layers=6, heads=4, experts=8, top_k=2, ffn=192)
GSM8K = "routellm_gsm8k_responses.csv.gz"
MBPP_TRAIN = "routerbench_0shot_mbpp_train.csv.gz"
MBPP_TEST = "routerbench_0shot_mbpp_test.csv.gz"


def _rows(path: Path) -> list[dict[str, str]]:
    csv.field_size_limit(1 << 27)
    with gzip.open(path, "rt", newline="") as fh:
        return list(csv.DictReader(fh))


def corpus(data_dir: Path) -> tuple[bytes, list[bytes]]:
    """(training text, held-out prompts)."""
    folder = data_dir / "router_quality"
    train: list[str] = []
    held_out: list[str] = []
    for i, row in enumerate(_rows(folder / GSM8K)):
        if i % 10 == 9:
            held_out.append(row["prompt"])
            continue
        train.append(row["prompt"])
        train.extend(v for k, v in row.items() if k.endswith("_response") and v)
    for row in _rows(folder / MBPP_TRAIN):
        train.append(row["prompt"])
        train.extend(v for k, v in row.items() if k.endswith("|model_response") and v)
    held_out.extend(row["prompt"] for row in _rows(folder / MBPP_TEST))
    text = "\n\n".join(train).encode("utf-8", "replace")
    return text, [p.encode("utf-8", "replace") for p in held_out]


def forward(
    cfg: TinyMoE, w: dict[str, Tensor], tokens: Tensor
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Batched causal forward of `Decoder`'s computation: (logits [B, T, vocab], the
    load-balancing loss, each layer's chosen experts [B*T, top_k])."""
    b, t = tokens.shape
    hd = cfg.dim // cfg.heads
    x = w["embed"][tokens]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    balance = x.new_zeros(())
    chosen = []
    for layer in range(cfg.layers):
        h = _norm(x)
        q, k, v = (
            (h @ w[f"{layer}.{n}"]).view(b, t, cfg.heads, hd).transpose(1, 2)
            for n in ("wq", "wk", "wv")
        )
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + att.transpose(1, 2).reshape(b, t, cfg.dim) @ w[f"{layer}.wo"]
        h = _norm(x).reshape(b * t, cfg.dim)
        logits = h @ w[f"{layer}.router"]
        top = torch.topk(logits, cfg.top_k)
        gates = torch.softmax(top.values, -1)
        out = torch.zeros_like(h)
        for e in range(cfg.experts):
            hit = top.indices == e
            rows = hit.any(-1).nonzero().squeeze(-1)
            if rows.numel() == 0:
                continue
            g = (gates * hit).sum(-1)[rows].unsqueeze(-1)
            y = torch.relu(h[rows] @ w[f"{layer}.w1"][e]) @ w[f"{layer}.w2"][e]
            out = out.index_add(0, rows, g * y)
        x = x + out.view(b, t, cfg.dim)
        share = F.one_hot(top.indices, cfg.experts).float().sum(1).mean(0) / cfg.top_k
        balance = balance + cfg.experts * (share * torch.softmax(logits, -1).mean(0)).sum()
        chosen.append(top.indices)
    return _norm(x) @ w["embed"].T, balance / cfg.layers, chosen


def _norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 3000
    batch: int = 16
    context: int = 128
    lr: float = 3e-3
    balance_coef: float = 0.01
    seed: int = 0
    eval_every: int = 250
    checkpoint_every: int = 250


def _batch(data: Tensor, s: TrainSettings, g: torch.Generator) -> Tensor:
    starts = torch.randint(0, len(data) - s.context - 1, (s.batch,), generator=g)
    return torch.stack([data[i : i + s.context + 1] for i in starts.tolist()])


def train(data_dir: Path, out: Path, settings: TrainSettings) -> dict[str, object]:
    """Train `MODEL`, writing `out` (weights and record); resumes from `out`.ckpt."""
    torch.manual_seed(settings.seed)
    text, held_out = corpus(data_dir)
    data = torch.tensor(list(text), dtype=torch.long)
    split = int(len(data) * 0.98)
    train_data, val_data = data[:split], data[split:]
    weights = init_weights(MODEL, settings.seed)
    weights["embed"] = weights["embed"] * MODEL.dim**-0.5  # tied output: start near uniform
    weights = {k: v.requires_grad_() for k, v in weights.items()}
    opt = torch.optim.AdamW(weights.values(), lr=settings.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(settings.seed)
    curve: list[dict[str, float]] = []
    step = 0
    ckpt = out.with_suffix(".ckpt")
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        with torch.no_grad():
            for k, v in state["weights"].items():
                weights[k].copy_(v)
        opt.load_state_dict(state["opt"])
        g.set_state(state["rng"])
        step, curve = state["step"], state["curve"]
        print(f"resumed at step {step}", file=sys.stderr, flush=True)
    started = time.monotonic()
    while step < settings.steps:
        lr = settings.lr * 0.5 * (1 + math.cos(math.pi * step / settings.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        batch = _batch(train_data, settings, g)
        logits, balance, _ = forward(MODEL, weights, batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, MODEL.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        (loss + settings.balance_coef * balance).backward()
        torch.nn.utils.clip_grad_norm_(weights.values(), 1.0)
        opt.step()
        step += 1
        if step % settings.eval_every == 0 or step == settings.steps:
            val = _evaluate(weights, val_data, settings)
            curve.append({"step": step, "train_loss": float(loss.detach()), **val})
            rate = step / max(1e-9, time.monotonic() - started)
            print(
                f"step {step}/{settings.steps} train {float(loss.detach()):.3f} "
                f"val {val['val_loss']:.3f} bits/byte {val['val_bits_per_byte']:.3f} "
                f"max expert share {val['max_expert_share']:.3f} ({rate:.1f} steps/s)",
                file=sys.stderr,
                flush=True,
            )
        if step % settings.checkpoint_every == 0 and step < settings.steps:
            torch.save(
                {
                    "weights": {k: v.detach() for k, v in weights.items()},
                    "opt": opt.state_dict(),
                    "rng": g.get_state(),
                    "step": step,
                    "curve": curve,
                },
                ckpt.with_suffix(".tmp"),
            )
            ckpt.with_suffix(".tmp").replace(ckpt)  # a kill mid-write leaves the last one
    record: dict[str, object] = {
        "model": asdict(MODEL),
        "settings": asdict(settings),
        "corpus_bytes": len(text),
        "held_out_prompts": len(held_out),
        "curve": curve,
    }
    torch.save({"weights": {k: v.detach().clone() for k, v in weights.items()}}, out)
    ckpt.unlink(missing_ok=True)
    return record


@torch.no_grad()
def _evaluate(weights: dict[str, Tensor], val: Tensor, s: TrainSettings) -> dict[str, float]:
    g = torch.Generator().manual_seed(1234)
    batch = _batch(val, replace(s, batch=32), g)
    logits, _, chosen = forward(MODEL, weights, batch[:, :-1])
    loss = float(F.cross_entropy(logits.reshape(-1, MODEL.vocab), batch[:, 1:].reshape(-1)))
    shares = torch.stack(
        [torch.bincount(c.reshape(-1), minlength=MODEL.experts) for c in chosen]
    ).float()
    shares = shares / shares.sum(-1, keepdim=True)
    return {
        "val_loss": loss,
        "val_bits_per_byte": loss / math.log(2),
        "max_expert_share": float(shares.max()),
    }


def load(path: Path) -> dict[str, Tensor]:
    weights: dict[str, Tensor] = torch.load(path, weights_only=True)["weights"]
    return weights
