"""`edgeroute train qos`: train the router on the edge-expert simulator.

Variants (the paper's ablations): `full` (HAN state abstraction + the QoS-aware reward
of eq. 16), `dsa` (HAN + completion-only reward), `baseline` (expert-level features +
completion-only reward: Baseline RL). `--zero-predictions` trains without predictors.
Prints progress, saves checkpoints, keeps the model with the best evaluation, and
exports its actor (encoder and head together) to ONNX with a parity check.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from edgeroute.qos.evaluate import BASELINES, evaluate
from edgeroute.qos.export import export_actor, parity
from edgeroute.qos.sac import SAC, Replay, SACConfig
from edgeroute.sim.edge import (
    EdgeEnv,
    NoisyOracle,
    Predictor,
    ServedPredictor,
    default_experts,
    load_tasks,
)
from policies.qos_drl import ScorePredictor


@dataclass(frozen=True)
class TrainConfig:
    variant: str = "full"
    experts: int = 6
    rate: float = 5.0
    latency_ms: float = 30.0
    steps: int = 20_000
    warmup: int = 1_000
    update_every: int = 2
    eval_every: int = 2_000
    eval_seeds: tuple[int, ...] = (1001, 1002)
    episode_len: int = 256
    seed: int = 0
    zero_predictions: bool = False
    threads: int = 2
    lr: float = 1e-4
    target_entropy_ratio: float = 0.7  # of log(actions): keeps exploring, resists collapse


def make_env(
    cfg: TrainConfig, data_dir: Path, reward: str, episode_len: int | None = None
) -> EdgeEnv:
    # The served predictor's real outputs on the agent's own split of the prompts
    # (`edgeroute.sim.edge.in_split`): never the truth, never the evaluation prompts.
    predictor: Predictor = (
        NoisyOracle(zero=True) if cfg.zero_predictions else ServedPredictor(ScorePredictor())
    )
    return EdgeEnv(
        default_experts(cfg.experts, seed=0),
        load_tasks(data_dir, split="agent"),
        rate=cfg.rate,
        latency_req=cfg.latency_ms / 1000,
        seed=cfg.seed,
        episode_len=episode_len or cfg.episode_len,
        reward=reward,  # type: ignore[arg-type]
        predictor=predictor,
    )


def train(cfg: TrainConfig, data_dir: Path, out: Path) -> dict[str, object]:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng(cfg.seed)
    reward = "qos" if cfg.variant == "full" else "completion"
    env = make_env(cfg, data_dir, reward)
    eval_env = make_env(cfg, data_dir, reward, episode_len=512)
    sac = SAC(
        SACConfig(
            encoder="experts" if cfg.variant == "baseline" else "han",
            lr=cfg.lr,
            target_entropy_ratio=cfg.target_entropy_ratio,
        ),
        n_actions=cfg.experts + 1,
    )
    obs = env.observe()
    replay = Replay(SACConfig().buffer, obs)
    out.mkdir(parents=True, exist_ok=True)
    best, history = -1.0, []
    started = time.time()
    last_log: dict[str, float] = {}
    for step in range(1, cfg.steps + 1):
        action = (
            int(rng.integers(0, cfg.experts + 1))
            if step <= cfg.warmup
            else sac.act(obs, greedy=False, rng=rng)
        )
        r, done = env.step(action)
        nxt = env.observe()
        replay.add(obs, action, r, nxt, done)
        obs = nxt
        if done:
            env.reset(int(rng.integers(1 << 30)))
            obs = env.observe()
        if step > cfg.warmup and step % cfg.update_every == 0:
            last_log = sac.update(replay, rng)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            score = evaluate(
                eval_env, lambda e, i: sac.act(e.observe(), True, rng), list(cfg.eval_seeds)
            )
            rate = step / (time.time() - started)
            history.append(
                {
                    "step": step,
                    "qos": score.qos,
                    "latency_ms": score.latency_ms,
                    "drop_rate": score.drop_rate,
                    **last_log,
                }
            )
            mark = ""
            if score.qos > best:
                best = score.qos
                torch.save(sac.actor.state_dict(), out / "best_actor.pt")
                mark = "  * best"
            torch.save(
                {"actor": sac.actor.state_dict(), "critic": sac.critic.state_dict(), "step": step},
                out / "checkpoint.pt",
            )
            print(
                f"step {step:>7}  {rate:6.0f} steps/s  eval QoS {score.qos:.3f}  "
                f"latency {score.latency_ms:5.1f} ms  drops {score.drop_rate:.1%}  "
                f"alpha {last_log.get('alpha', float('nan')):.3f}{mark}",
                flush=True,
            )
    sac.actor.load_state_dict(torch.load(out / "best_actor.pt"))
    export_actor(sac.actor, out / "actor.onnx")
    diff = parity(sac.actor, out / "actor.onnx")
    result = {
        "config": asdict(cfg),
        "best_eval_qos": best,
        "onnx_parity_max_abs": diff,
        "history": history,
        "seconds": round(time.time() - started, 1),
        "baselines": {
            name: asdict(evaluate(eval_env, policy, list(cfg.eval_seeds)))
            for name, policy in BASELINES.items()
        },
    }
    (out / "training.json").write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"best eval QoS {best:.3f}; ONNX parity max |diff| {diff:.2e}; exported "
        f"{out / 'actor.onnx'}"
    )
    return result
