"""One actor that acts as an ensemble does: the ensemble distilled.

An ensemble (`edgeroute.qos.ensemble`) costs every member's nodes per decision; five
members take a decision out of the 300 us budget. Distilled, one actor of the members'
own shape learns the ensemble's action probabilities on the states the ensemble visits
in the members' training worlds (their fleets, loads and targets, drawn as in
training; their prompts; the served predictor), by cross-entropy against them, and is
exported as any actor. Some worlds are acted by the ensemble's argmax (the states it
meets served) and some by draws from it (the states around them).

A copy that agrees with the ensemble on most of the states the ensemble visits can
still herd, in states the ensemble never reaches. With `rounds` above 1, each further
round gathers half as many states again where the student acts (its argmax in some
worlds, draws in others), labels them with the ensemble, and fits the student further
on all it has (DAgger: Ross, Gordon and Bagnell, 2011).

The student is scored where training scores its checkpoints (`train.eval_score`: the
training hardware and prompts), beside the ensemble, so a poor copy shows before it
is benchmarked.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from edgeroute.qos.config import DistillConfig, TrainConfig, read_record, write_record
from edgeroute.qos.evaluate import Policy
from edgeroute.qos.export import export_actor, parity
from edgeroute.qos.model import QoSNet
from edgeroute.qos.sac import batch_of, stack
from edgeroute.qos.train import (
    eval_score,
    make_env,
    new_episode,
    source_commit,
    training_predictor,
    training_trace,
)
from edgeroute.sim.edge import load_tasks
from policies.onnx_session import one_thread_session
from policies.qos_action import drawn
from policies.qos_state import INPUTS


class OnnxActor:
    """An actor file (an ensemble's, or any run's) run by onnxruntime on batches of
    training observations."""

    def __init__(self, actor: Path) -> None:
        self.session = one_thread_session(actor)
        self.inputs = [i.name for i in self.session.get_inputs()]

    def logits(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        one = obs["arrived"].ndim == 1
        feeds = {k: obs[k][None] if one else obs[k] for k in self.inputs}
        out: np.ndarray = self.session.run(["logits"], feeds)[0]
        return out

    def policy(self) -> Policy:
        """Its argmax, as a simulator policy."""
        return lambda env, i: int(self.logits(env.observe())[0].argmax())


class Actor(Protocol):
    def logits(self, obs: dict[str, np.ndarray]) -> np.ndarray: ...


class Student:
    """An actor being fitted, acting in the worlds."""

    def __init__(self, net: QoSNet) -> None:
        self.net = net

    @torch.no_grad()
    def logits(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        self.net.eval()
        out: np.ndarray = self.net(*batch_of(obs)).numpy()
        return out


def visited(
    teacher: OnnxActor,
    cfg: TrainConfig,
    dc: DistillConfig,
    data_dir: Path,
    acting: Actor | None = None,
    states: int | None = None,
    seed: int | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`states` (`dc.states`) observations from `cfg.envs` training worlds acted by
    `acting` (the teacher), and the teacher's logits on each."""
    states = dc.states if states is None else states
    rng = np.random.default_rng(dc.seed if seed is None else seed)
    predictor = training_predictor(cfg)
    tasks = load_tasks(data_dir, split="agent", quality=cfg.quality)
    trace = training_trace(cfg, data_dir)
    envs = [make_env(cfg, data_dir, predictor=predictor, tasks=tasks) for _ in range(cfg.envs)]
    for env in envs:
        new_episode(env, cfg, rng, trace)
    by_draws = np.arange(len(envs)) < round(dc.drawn_share * len(envs))
    observations: list[dict[str, np.ndarray]] = []
    logits: list[np.ndarray] = []
    started, shown = time.time(), 0
    while len(observations) < states:
        obs = stack([env.observe() for env in envs])
        out = teacher.logits(obs)
        acts = out if acting is None else acting.logits(obs)
        actions = np.where(
            by_draws, drawn(acts.astype(np.float64), rng.random((len(envs), 1))), acts.argmax(-1)
        )
        observations.extend({k: obs[k][i] for k in INPUTS} for i in range(len(envs)))
        logits.append(out)
        for env, action in zip(envs, actions, strict=True):
            _, done = env.step(int(action))
            if done:
                new_episode(env, cfg, rng, trace)
        if len(observations) - shown >= states // 10:
            shown = len(observations)
            print(f"visited {shown:>8} states  {time.time() - started:5.0f} s", flush=True)
    return stack(observations[:states]), np.concatenate(logits)[:states]


def split(n: int, dc: DistillConfig, round_: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A round's `n` states: the rows fitted on and the `dc.held_out` share kept aside."""
    seed = dc.seed if round_ == 0 else (dc.seed, round_)
    order = np.random.default_rng(seed).permutation(n)
    cut = len(order) - max(1, round(dc.held_out * len(order)))
    return order[:cut], order[cut:]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    out: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


def fitted(
    cfg: TrainConfig,
    dc: DistillConfig,
    obs: dict[str, np.ndarray],
    logits: np.ndarray,
    rows: tuple[np.ndarray, np.ndarray] | None = None,
    student: QoSNet | None = None,
    round_: int = 0,
) -> tuple[QoSNet, dict[str, float]]:
    """An actor of `cfg`'s shape (fresh, or `student` fitted further) fitted to the
    teacher's probabilities on `obs` (cross-entropy) over `rows` (fitted, held out;
    `split`'s by default), and how close it came on the held-out rows: its
    cross-entropy above the teacher's own entropy (the KL) and how often its argmax is
    the teacher's. Later rounds take half the passes."""
    if student is None:
        torch.manual_seed(dc.seed)
        sac = cfg.sac()
        student = QoSNet(sac.encoder, sac.hidden, sac.heads, sac.layers, load=sac.load)
        if not sac.drop:
            student.head.forbid_drop()
    target = np.exp(_log_softmax(logits.astype(np.float64))).astype(np.float32)
    train, held = rows or split(len(logits), dc)
    epochs = dc.epochs if round_ == 0 else max(1, dc.epochs // 2)
    tensors = [torch.from_numpy(obs[k]) for k in INPUTS]
    probs = torch.from_numpy(target)
    opt = torch.optim.Adam(student.parameters(), lr=dc.lr)

    def measured(rows: np.ndarray) -> dict[str, float]:
        with torch.no_grad():
            out = student(*(t[rows] for t in tensors))
        p = probs[rows]
        own = torch.log_softmax(out, -1)
        # where the teacher puts no mass (a drop the actor forbids), nothing is lost
        kl = (p * (torch.log(p.clamp_min(1e-30)) - own)).sum(-1).mean()
        agree = (out.argmax(-1) == p.argmax(-1)).float().mean()
        return {"kl": float(kl), "argmax_agreement": float(agree)}

    rng = np.random.default_rng(dc.seed + 1 if round_ == 0 else (dc.seed + 1, round_))
    started = time.time()
    for epoch in range(epochs):
        student.train()
        for batch in np.array_split(rng.permutation(train), max(1, len(train) // dc.batch)):
            out = student(*(t[batch] for t in tensors))
            loss = -(probs[batch] * torch.log_softmax(out, -1)).sum(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        student.eval()
        m = measured(held)
        print(
            f"round {round_ + 1}  epoch {epoch + 1:>2}/{epochs}  held-out KL {m['kl']:.4f}  "
            f"argmax agreement {m['argmax_agreement']:.1%}  {time.time() - started:5.0f} s",
            flush=True,
        )
    return student, measured(held)


def distill(teacher_dir: Path, data_dir: Path, out: Path, dc: DistillConfig) -> dict[str, Any]:
    """`out/actor.onnx`, one actor acting as the actor in `teacher_dir` (an ensemble's
    or a run's, with its record), and its record. Returns the record."""
    config = read_record(teacher_dir)["config"]
    cfg = replace(TrainConfig.from_record({**config, "seed": dc.seed}), seed=dc.seed)
    torch.set_num_threads(cfg.threads)
    teacher = OnnxActor(teacher_dir / "actor.onnx")
    obs, logits = visited(teacher, cfg, dc, data_dir)
    train, held = split(len(logits), dc)
    student, close = fitted(cfg, dc, obs, logits, (train, held))
    rounds = [close]
    for r in range(1, dc.rounds):
        more, labels = visited(
            teacher, cfg, dc, data_dir, Student(student), dc.states // 2, seed=dc.seed + r
        )
        fit, keep = split(len(labels), dc, r)
        train = np.concatenate([train, len(logits) + fit])
        held = np.concatenate([held, len(logits) + keep])
        obs = {k: np.concatenate([obs[k], more[k]]) for k in obs}
        logits = np.concatenate([logits, labels])
        student, close = fitted(cfg, dc, obs, logits, (train, held), student, r)
        rounds.append(close)
    out.mkdir(parents=True, exist_ok=True)
    export_actor(student, out / "actor.onnx", cfg.speed_prior)
    diff = parity(student, out / "actor.onnx")
    env = make_env(cfg, data_dir, episode_len=512)
    scores = {
        "teacher": eval_score(env, cfg, teacher.policy()),
        "student": eval_score(env, cfg, OnnxActor(out / "actor.onnx").policy()),
    }
    print(
        f"evaluated on training hardware: ensemble {scores['teacher']['qos']:.3f}, "
        f"distilled {scores['student']['qos']:.3f}; ONNX parity max |diff| {diff:.2e}"
    )
    record = {
        "commit": source_commit(),
        "distilled": {
            "teacher": str(teacher_dir),
            **asdict(dc),
            **close,
            "rounds_measured": rounds,
            "teacher_eval_qos": scores["teacher"]["qos"],
            "eval_qos": scores["student"]["qos"],
        },
        "config": asdict(cfg),
        "onnx_parity_max_abs": diff,
    }
    write_record(out, record)
    return record


__all__ = [
    "Actor",
    "DistillConfig",
    "OnnxActor",
    "Student",
    "distill",
    "fitted",
    "split",
    "visited",
]
