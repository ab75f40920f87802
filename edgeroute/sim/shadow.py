"""OD-MoE's shadow-model expert prediction, measured on a small MoE transformer.

A small decoder-only MoE at full precision (fp32) decodes greedily: the trained one of
`edgeroute.sim.moe_lm`, or random weights for contrast; a quantised copy (fp16, int8 per-channel, or a 4-bit NF4-style blockwise scheme) runs
beside it as the shadow and predicts each layer's experts. Recall (the OD-MoE paper's
eq. 2-3) is the share of the full model's activated experts that the shadow predicted,
per output token index and overall. Alignment copies the full model's token into the
shadow's input (token alignment) and/or its KV cache into the shadow's (KV alignment)
every `period` tokens.

This is a small model, not Mixtral-8x7B, so the recall figures are comparable to the
paper's in direction (what quantisation and alignment do), not in level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

NF4 = torch.tensor(
    [
        -1.0,
        -0.6962,
        -0.5251,
        -0.3949,
        -0.2844,
        -0.1848,
        -0.0911,
        0.0,
        0.0796,
        0.1609,
        0.2461,
        0.3379,
        0.4407,
        0.5626,
        0.7230,
        1.0,
    ]
)


@dataclass(frozen=True)
class TinyMoE:
    vocab: int = 512
    dim: int = 128
    layers: int = 8
    heads: int = 4
    experts: int = 8
    top_k: int = 2
    ffn: int = 256


def init_weights(cfg: TinyMoE, seed: int = 0) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)

    def w(*shape: int, scale: float) -> Tensor:
        return torch.randn(*shape, generator=g) * scale

    d = cfg.dim
    p: dict[str, Tensor] = {"embed": w(cfg.vocab, d, scale=1.0)}
    for layer in range(cfg.layers):
        for name in ("wq", "wk", "wv", "wo"):
            p[f"{layer}.{name}"] = w(d, d, scale=d**-0.5)
        p[f"{layer}.router"] = w(d, cfg.experts, scale=d**-0.5)
        p[f"{layer}.w1"] = w(cfg.experts, d, cfg.ffn, scale=d**-0.5)
        p[f"{layer}.w2"] = w(cfg.experts, cfg.ffn, d, scale=cfg.ffn**-0.5)
    return p


def quantise(weights: dict[str, Tensor], scheme: str) -> dict[str, Tensor]:
    """A dequantised copy: what a shadow at that precision computes with."""
    out = {}
    for name, t in weights.items():
        if scheme == "fp16":
            q = t.half().float()
        elif scheme == "int8":  # per output channel, symmetric
            scale = t.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127
            q = (t / scale).round().clamp(-127, 127) * scale
        elif scheme == "nf4":  # blocks of 64, absmax-normalised to the NF4 levels
            flat = t.reshape(-1, 64) if t.numel() % 64 == 0 else t.reshape(1, -1)
            scale = flat.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
            idx = (flat / scale).unsqueeze(-1).sub(NF4).abs().argmin(-1)
            q = (NF4[idx] * scale).reshape(t.shape)
        else:
            raise ValueError(f"unknown scheme {scheme!r}")
        out[name] = q
    return out


def _norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Decoder:
    """One sequence's autoregressive state under one set of weights."""

    def __init__(self, cfg: TinyMoE, weights: dict[str, Tensor]) -> None:
        self.cfg, self.w = cfg, weights
        self.keys: list[list[Tensor]] = [[] for _ in range(cfg.layers)]
        self.values: list[list[Tensor]] = [[] for _ in range(cfg.layers)]

    def step(self, token: int) -> tuple[int, list[set[int]]]:
        """Feed one token; returns the next (greedy) token and each layer's experts."""
        c, w = self.cfg, self.w
        x = w["embed"][token]
        chosen = []
        hd = c.dim // c.heads
        for layer in range(c.layers):
            h = _norm(x)
            q, k, v = (h @ w[f"{layer}.{n}"] for n in ("wq", "wk", "wv"))
            self.keys[layer].append(k)
            self.values[layer].append(v)
            ks, vs = torch.stack(self.keys[layer]), torch.stack(self.values[layer])
            att = torch.softmax(
                (ks.view(-1, c.heads, hd) * q.view(c.heads, hd)).sum(-1) / hd**0.5, dim=0
            )
            x = (
                x
                + (att.unsqueeze(-1) * vs.view(-1, c.heads, hd)).sum(0).reshape(-1)
                @ w[f"{layer}.wo"]
            )
            h = _norm(x)
            logits = h @ w[f"{layer}.router"]
            top = torch.topk(logits, c.top_k)
            gates = torch.softmax(top.values, -1)
            out = torch.zeros_like(x)
            for g, e in zip(gates, top.indices.tolist(), strict=True):
                out = out + g * (torch.relu(h @ w[f"{layer}.w1"][e]) @ w[f"{layer}.w2"][e])
            x = x + out
            chosen.append(set(top.indices.tolist()))
        return int(torch.argmax(_norm(x) @ w["embed"].T)), chosen

    def align_kv(self, other: Decoder) -> None:
        # The cached tensors are never written in place, so sharing them is a copy.
        self.keys = [list(k) for k in other.keys]
        self.values = [list(v) for v in other.values]


@dataclass(frozen=True)
class ShadowResult:
    recall: list[float]  # eq. 2 per output token index
    layer_hit: float  # share of (token, layer) steps whose experts were all predicted
    per_prompt: list[float]  # eq. 3 for each prompt alone


def random_prompts(cfg: TinyMoE, count: int, seed: int, length: int = 8) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed + 1)
    return [torch.randint(0, cfg.vocab, (length,), generator=g).tolist() for _ in range(count)]


@torch.no_grad()
def measure(
    cfg: TinyMoE,
    weights: dict[str, Tensor],
    scheme: str,
    token_period: int | None,
    kv_period: int | None,
    prompts: Sequence[Sequence[int]],
    tokens: int = 64,
) -> ShadowResult:
    """Decode `tokens` after each prompt with the full model and its shadow side by side.

    A period of None means never aligned; 1 means aligned at every token.
    """
    shadow_w = quantise(weights, scheme)
    hits = [0.0] * tokens
    layer_hits = 0
    per_prompt = []
    for prompt in prompts:
        mine = 0.0
        full, shadow = Decoder(cfg, weights), Decoder(cfg, shadow_w)
        for t in prompt[:-1]:
            full.step(t)
            shadow.step(t)
        tok_full = tok_shadow = prompt[-1]
        for n in range(tokens):
            if token_period and n % token_period == 0:
                tok_shadow = tok_full
            if kv_period and n % kv_period == 0:
                shadow.align_kv(full)
            next_full, actual = full.step(tok_full)
            next_shadow, predicted = shadow.step(tok_shadow)
            pairs = list(zip(actual, predicted, strict=True))
            recalled = sum(len(a & p) for a, p in pairs) / (cfg.top_k * cfg.layers)
            hits[n] += recalled
            mine += recalled
            layer_hits += sum(a == p for a, p in pairs)
            tok_full, tok_shadow = next_full, next_shadow
        per_prompt.append(mine / tokens)
    return ShadowResult(
        recall=[h / len(prompts) for h in hits],
        layer_hit=layer_hits / (len(prompts) * tokens * cfg.layers),
        per_prompt=per_prompt,
    )
