"""`edgeroute train qos`: train the router on the edge-expert simulator.

Variants (the paper's ablations): `full` (HAN state abstraction + the QoS-aware reward
of eq. 16), `dsa` (HAN + completion-only reward), `baseline` (expert-level features +
completion-only reward: Baseline RL). `--zero-predictions` trains without predictors.

Several environments step in lockstep and act in one batched forward pass; each
episode draws its hardware from the training share (`TRAIN_HARDWARE`) and, with
`randomise`, its arrival rate and latency target from the paper's sweep ranges, so one
agent serves every setting and is evaluated on hardware it never saw. Prints progress,
checkpoints learner, optimisers and replay (a run that is stopped resumes from its last
checkpoint), keeps the actor with the best evaluation on training hardware and
prompts, and exports it to ONNX with a parity check.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from edgeroute.qos.config import (
    SWEEP_LATENCIES_MS,
    SWEEP_RATES,
    TrainConfig,
    quality_dir,
    read_record,
    write_record,
)
from edgeroute.qos.evaluate import Policy, evaluate, shortest_queue
from edgeroute.qos.export import export_actor, parity
from edgeroute.qos.sac import SAC, Replay, stack
from edgeroute.results_io import git, machine
from edgeroute.sim.edge import (
    HINDSIGHT,
    QUALITY_MODELS,
    TRAIN_HARDWARE,
    EdgeEnv,
    EdgeExpert,
    NoisyOracle,
    Predictor,
    Req,
    ServedPredictor,
    Task,
    default_experts,
    load_tasks,
    observe,
    trace_arrivals,
)
from edgeroute.sim.workload import TraceRequest, read_trace
from policies.predictor import ScorePredictor, predictor_dir

Obs = dict[str, np.ndarray]
PHASES = ("acting", "simulator", "credit and replay", "SAC updates", "evaluation and checkpoints")
# Wall seconds between progress lines while no evaluation is due: with sparse
# evaluations a long run would otherwise print nothing for half an hour.
PROGRESS_SECONDS = 60.0


def training_predictor(cfg: TrainConfig) -> Predictor:
    """The served predictor's real outputs (never the truth), or none at all."""
    if cfg.zero_predictions:
        return NoisyOracle(zero=True)
    return ServedPredictor(ScorePredictor(Path(cfg.predictor or quality_dir(cfg.quality))))


def check_served_predictor(cfg: TrainConfig, out: Path) -> None:
    """Refuse a run with a predictor of its own whose actor, written to `out`, would be
    served with another (the nearest one above it: `predictor_dir`)."""
    if cfg.predictor and predictor_dir(out) != Path(cfg.predictor).resolve():
        raise SystemExit(
            f"an actor in {out} is served with {predictor_dir(out)}'s predictor, not "
            f"{cfg.predictor}'s: train it into a folder under {cfg.predictor}"
        )


def experts_for(cfg: TrainConfig, hardware: int, n: int | None = None) -> list[EdgeExpert]:
    """The training fleet drawn from `hardware`: `cfg.experts` experts, or `n`."""
    return default_experts(
        cfg.experts if n is None else n,
        seed=hardware,
        models=QUALITY_MODELS[cfg.quality],
        fleet=cfg.fleet,
    )


def fleet_size(cfg: TrainConfig, rng: np.random.Generator) -> int:
    """A new episode's N: `cfg.experts`, or (with `cfg.experts_range`) a draw in the
    range; without a range nothing is drawn, so other configs train as before."""
    if cfg.experts_range is None:
        return cfg.experts
    low, high = cfg.experts_range
    return int(rng.integers(low, high + 1))


def observed(env: EdgeEnv, cfg: TrainConfig) -> Obs:
    """A training observation, padded to the largest fleet an episode may draw so that
    the environments' observations stack (padding changes nothing for the real
    experts: `tests/edgeroute/qos/test_model.py`)."""
    return observe(env, cfg.most_experts)


def make_env(
    cfg: TrainConfig,
    data_dir: Path,
    episode_len: int | None = None,
    predictor: Predictor | None = None,
    tasks: list[Task] | None = None,
) -> EdgeEnv:
    # On the agent's own split of the prompts (`edgeroute.sim.edge.in_split`): never
    # the evaluation prompts, never the predictor's.
    return EdgeEnv(
        experts_for(cfg, TRAIN_HARDWARE[0]),
        tasks or load_tasks(data_dir, split="agent", quality=cfg.quality),
        rate=cfg.rate,
        latency_req=cfg.latency_ms / 1000,
        episode_len=episode_len or cfg.episode_len,
        reward=cfg.reward,  # type: ignore[arg-type]
        predictor=predictor or training_predictor(cfg),
        impact=cfg.impact,  # type: ignore[arg-type]
        scrape=None if cfg.scrape_ms is None else cfg.scrape_ms / 1000,
        speed_prior=cfg.speed_prior,
    )


def training_trace(cfg: TrainConfig, data_dir: Path) -> list[TraceRequest]:
    """The trace whose windows some training episodes run, if any: `cfg.trace`, a path
    in the data folder (or an absolute one), long enough for an episode's window."""
    if not cfg.trace_share:
        return []
    trace = read_trace(data_dir / cfg.trace)
    if window_starts(trace, cfg.episode_len) < 1:
        raise ValueError(
            f"the trace {cfg.trace} holds {len(trace)} requests; an episode of "
            f"{cfg.episode_len} decisions needs at least {cfg.episode_len + 3}"
        )
    return trace


def window_starts(trace: Sequence[TraceRequest], episode_len: int) -> int:
    """How many first requests an episode's window of `trace` can start at: an episode
    reads its decisions plus two more requests."""
    return len(trace) - episode_len - 2


def new_episode(
    env: EdgeEnv,
    cfg: TrainConfig,
    rng: np.random.Generator,
    trace: Sequence[TraceRequest] = (),
) -> None:
    """The next training episode: hardware drawn from the training seeds, lambda and L
    from the config's ranges, and with probability `cfg.trace_share` the arrivals of a
    window of `trace` (the trace read from `cfg.trace`) at that lambda."""
    hardware = int(rng.integers(TRAIN_HARDWARE.start, TRAIN_HARDWARE.stop))
    experts = experts_for(cfg, hardware, fleet_size(cfg, rng))
    rate, latency = cfg.rate, cfg.latency_ms / 1000
    if cfg.randomise:
        rate = float(rng.uniform(*cfg.rates))
        if cfg.latency_over_fastest is None:
            latency = float(rng.uniform(*cfg.latencies_ms)) / 1000
        else:
            fastest = min(e.base for e in experts)
            latency = fastest * float(rng.uniform(*cfg.latency_over_fastest))
    arrivals = None
    # no draw at all without trace episodes, so that other configs train as before
    if cfg.trace_share and rng.random() < cfg.trace_share:
        start = int(rng.integers(0, window_starts(trace, env.episode_len)))
        arrivals = trace_arrivals(trace, rate, start=start)
    env.reset(
        int(rng.integers(1 << 30)),
        experts=experts,
        rate=rate,
        latency_req=latency,
        arrivals=arrivals,
    )


# The most decisions a herded start forces onto its expert (`herded_start`): at the
# sweep's loads, several seconds of arrivals, enough to leave that expert with more in
# flight than a steady agent ever gives one.
HERD_DECISIONS = 40


class Herd(NamedTuple):
    """The decisions still to go to one expert at an episode's start, whatever the actor
    says (`herded_start`); none by default."""

    action: int = 0
    decisions: int = 0


def herded_start(cfg: TrainConfig, rng: np.random.Generator, experts: int) -> Herd:
    """A new episode's first decisions that go to one of its `experts` drawn at random
    (with probability `cfg.herded_starts`; else none). Stored like any other, they show the
    critic where herding leads and what leaving it is worth, states a steady actor
    seldom visits (docs/research.md, (145))."""
    if cfg.herded_starts == 0 or rng.random() >= cfg.herded_starts:
        return Herd()
    return Herd(int(rng.integers(1, experts + 1)), int(rng.integers(1, HERD_DECISIONS + 1)))


def weighed(reward: float, penalty: float, scale: float) -> float:
    """A step's reward, which holds the impact penalty once (eq. 16), with the penalty
    weighed `scale` instead (`TrainConfig.impact_scale`)."""
    return reward - (scale - 1.0) * penalty


class Pending:
    """Per-request credit: a decision's transition waits until the request it routed
    finishes, and is then stored with that request's own QoS (eq. 1), less the action
    impact penalty (eq. 15) the decision incurred. A drop is stored at once, at 0. With
    an impact known in hindsight (`EdgeEnv.hindsight_charges`) the
    penalty depends on requests routed after it, so the episode's transitions wait for
    its end."""

    def __init__(
        self, replay: Replay, impact_weight: Callable[[float], float] = lambda rate: 1.0
    ) -> None:
        self.replay = replay
        # the penalty's weight in an episode of a given lambda (`TrainConfig.impact_weight`),
        # read when crediting: an episode's credit settles before the next one starts
        self.impact_weight = impact_weight
        self.waiting: list[tuple[Req, Obs, int, float, Obs, bool]] = []

    def add(self, env: EdgeEnv, obs: Obs, action: int, nxt: Obs, done: bool) -> None:
        req = env.last_request
        if req is None:
            weight = self.impact_weight(env.rate)
            self.replay.add(obs, action, -weight * env.last_penalty, nxt, done)
        else:
            self.waiting.append((req, obs, action, env.last_penalty, nxt, done))

    def settle(self, env: EdgeEnv, ended: bool = False) -> None:
        """Store what can be credited; `ended`: the episode has ended and drained."""
        hindsight = env.impact in HINDSIGHT and env.reward_kind == "qos"
        if hindsight and not ended:
            return
        charges = env.hindsight_charges() if hindsight else {}
        weight = self.impact_weight(env.rate)
        keep = []
        for item in self.waiting:
            req, obs, action, penalty, nxt, done = item
            if math.isfinite(req.done_at):
                if hindsight:
                    charged = charges[req]
                    penalty = charged.shared if env.impact == "shared" else charged.hindsight
                self.replay.add(obs, action, env.qos(req) - weight * penalty, nxt, done)
            else:
                keep.append(item)
        self.waiting = keep


def eval_settings(cfg: TrainConfig) -> list[tuple[float, float]]:
    """The (lambda, L ms) of each evaluation episode: the default setting every time,
    or ("sweep") the default and then each point of the paper's sweeps once."""
    default = (cfg.rate, cfg.latency_ms)
    if cfg.select_on != "sweep":
        return [default] * cfg.eval_episodes
    return [
        default,
        *((r, cfg.latency_ms) for r in SWEEP_RATES),
        *((cfg.rate, lat) for lat in SWEEP_LATENCIES_MS),
    ]


def eval_score(env: EdgeEnv, cfg: TrainConfig, policy: Policy) -> dict[str, float]:
    """Episodes on training hardware and prompts (hardware seeds 1, 2, ...): what
    checkpoints are chosen by, so the held-out splits stay unseen."""
    scores = []
    for k, (rate, latency_ms) in enumerate(eval_settings(cfg)):
        env.reset(  # the environment keeps this hardware, load and L for `evaluate`
            experts=experts_for(cfg, TRAIN_HARDWARE[k]),
            rate=rate,
            latency_req=latency_ms / 1000,
        )
        scores.append(evaluate(env, policy, [1001 + k]))
    return {
        "qos": float(np.mean([s.qos for s in scores])),
        "latency_ms": float(np.mean([s.latency_ms for s in scores])),
        "drop_rate": float(np.mean([s.drop_rate for s in scores])),
    }


def acting(sac: SAC, greedy: bool, rng: np.random.Generator) -> Policy:
    """The actor as a policy: its most likely action, or (`greedy` False) a draw."""
    return lambda env, i: sac.act(env.observe(), greedy, rng)


def source_commit() -> str:
    """The checkout's commit, marked `-dirty` when its tracked files differ from it."""
    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def training_machine() -> dict[str, Any]:
    """What a run was trained on (`results_io.machine`, and the vector instructions
    torch's kernels chose): SAC turns the last-digit rounding of one processor's kernels
    against another's into another run, so a rebuild is bit for bit only on the same
    kind (`edgeroute.qos.rebuild`)."""
    return {**machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _save(obj: object, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # a run killed while saving keeps its previous checkpoint


def train(cfg: TrainConfig, data_dir: Path, out: Path, resume: bool = True) -> dict[str, object]:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng(cfg.seed)
    check_served_predictor(cfg, out)
    predictor = training_predictor(cfg)
    tasks = load_tasks(data_dir, split="agent", quality=cfg.quality)
    trace = training_trace(cfg, data_dir)
    envs = [make_env(cfg, data_dir, predictor=predictor, tasks=tasks) for _ in range(cfg.envs)]
    eval_env = make_env(cfg, data_dir, episode_len=512, predictor=predictor, tasks=tasks)
    sac = SAC(cfg.sac(), experts=cfg.most_experts)
    for env in envs:
        new_episode(env, cfg, rng, trace)
    forced = [herded_start(cfg, rng, len(env.experts)) for env in envs]
    obs = [observed(env, cfg) for env in envs]
    replay = Replay(cfg.sac().buffer, obs[0])
    pending = [Pending(replay, cfg.impact_weight) for _ in envs]
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint.pt"
    step, best, history, seconds = 0, -1.0, [], 0.0
    reference = eval_score(eval_env, cfg, shortest_queue)
    if resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        # more steps, or another actor kept at the end: carry on
        if replace(TrainConfig.from_record(state["config"]), steps=cfg.steps, keep=cfg.keep) != cfg:
            raise SystemExit(f"{ckpt} was written with another config; move it or drop it")
        if state["step"] > cfg.steps:  # its record would claim fewer steps than it had
            raise SystemExit(
                f"{ckpt} is at step {state['step']}, past the {cfg.steps} asked for; "
                "ask for at least as many (as many finishes the run where it stopped)"
            )
        sac.load_state_dict(state["sac"])
        replay.load_state_dict(state["replay"])
        rng.bit_generator.state = state["rng"]
        step, best, history, seconds = (
            state["step"],
            state["best"],
            state["history"],
            state["seconds"],
        )
        for env in envs:  # episodes restart (their pending credit is lost); the learner
            # and its memory carry on
            new_episode(env, cfg, rng, trace)
        forced = [herded_start(cfg, rng, len(env.experts)) for env in envs]
        obs = [observed(env, cfg) for env in envs]
        print(f"resumed {ckpt} at step {step}", flush=True)
    started = time.time() - seconds
    last_log: dict[str, float] = {}
    next_eval = (step // cfg.eval_every + 1) * cfg.eval_every
    spent = dict.fromkeys(PHASES, 0.0)  # where the time goes, this session
    # this session's rate, on a clock that never steps back (a wall clock may)
    session_start = shown = time.monotonic()
    session_step = step
    while step < cfg.steps:
        t0 = time.perf_counter()
        if step < cfg.warmup:
            # one draw per environment in its own fleet (the same draws as one bound)
            actions = rng.integers(int(not cfg.drop), [len(env.experts) + 1 for env in envs])
        else:
            actions = sac.act_batch(stack(obs), greedy=False, rng=rng)
        for k, herd in enumerate(forced):
            if herd.decisions > 0:
                actions[k] = herd.action
                forced[k] = herd._replace(decisions=herd.decisions - 1)
        spent["acting"] += time.perf_counter() - t0
        for k, env in enumerate(envs):
            t0 = time.perf_counter()
            r, done = env.step(int(actions[k]))
            nxt = observed(env, cfg)
            t1 = time.perf_counter()
            spent["simulator"] += t1 - t0
            if cfg.credit == "request":
                pending[k].add(env, obs[k], int(actions[k]), nxt, done)
                if done:
                    env.drain()  # every routed request finishes, so all are credited
                pending[k].settle(env, ended=done)
            else:  # the paper's letter: completions are rewarded when they happen
                r = weighed(r, env.last_penalty, cfg.impact_weight(env.rate))
                replay.add(obs[k], int(actions[k]), r, nxt, done)
            if done:
                new_episode(env, cfg, rng, trace)
                forced[k] = herded_start(cfg, rng, len(env.experts))
                nxt = observed(env, cfg)
            obs[k] = nxt
            spent["credit and replay"] += time.perf_counter() - t1
        before, step = step, step + len(envs)
        t0 = time.perf_counter()
        # Credit in hindsight waits for a whole episode: with long episodes the replay
        # can still be empty after the warm-up.
        if step > cfg.warmup and replay.size > 0:
            for _ in range(step // cfg.update_every - before // cfg.update_every):
                last_log = sac.update(replay, rng)
        spent["SAC updates"] += time.perf_counter() - t0
        evaluating = step >= next_eval or step >= cfg.steps
        if not evaluating and time.monotonic() - shown >= PROGRESS_SECONDS:
            shown = time.monotonic()
            print(progress(step, cfg.steps, step - session_step, shown - session_start), flush=True)
        if evaluating:
            t0 = time.perf_counter()
            next_eval += cfg.eval_every
            score = eval_score(eval_env, cfg, acting(sac, True, rng))
            # The same episodes acted by draws from the policy, as it acts in training: a
            # policy whose argmax herds onto one expert can still draw well. Its own
            # generator, so that training goes on as it would without it.
            draws = np.random.default_rng((cfg.seed, step))
            drawn = eval_score(eval_env, cfg, acting(sac, False, draws))
            elapsed = time.time() - started
            history.append(
                {
                    "step": step,
                    "seconds": round(elapsed, 1),
                    **score,
                    "qos_drawn": drawn["qos"],
                    **last_log,
                }
            )
            mark = ""
            if score["qos"] > best:
                best = score["qos"]
                torch.save(sac.actor.state_dict(), out / "best_actor.pt")
                mark = "  * best"
            _save(
                {
                    "config": asdict(cfg),
                    "sac": sac.state_dict(),
                    "replay": replay.state_dict(),
                    "rng": rng.bit_generator.state,
                    "step": step,
                    "best": best,
                    "history": history,
                    "seconds": elapsed,
                },
                ckpt,
            )
            spent["evaluation and checkpoints"] += time.perf_counter() - t0
            print(
                f"step {step:>7}  {step / elapsed:6.0f} steps/s  eval QoS {score['qos']:.3f} "
                f"(drawn {drawn['qos']:.3f}, SQF {reference['qos']:.3f})  "
                f"drops {score['drop_rate']:.1%}  "
                f"alpha {last_log.get('alpha', float('nan')):.3f}  "
                f"entropy {last_log.get('entropy', float('nan')):.2f}{mark}",
                flush=True,
            )
    if cfg.keep == "best":
        sac.actor.load_state_dict(torch.load(out / "best_actor.pt"))
    export_actor(sac.actor, out / "actor.onnx", cfg.speed_prior)
    diff = parity(sac.actor, out / "actor.onnx")
    shares = {k: round(v / max(1e-9, sum(spent.values())), 3) for k, v in spent.items()}
    result = {
        "commit": source_commit(),
        "config": asdict(cfg),
        "best_eval_qos": best,
        "sqf_eval_qos": reference["qos"],
        "onnx_parity_max_abs": diff,
        **(kept_last(step, history) if cfg.keep == "last" else {}),
        "history": history,
        "seconds": round(time.time() - started, 1),
        "steps_per_second": round(step / (time.time() - started), 1),
        "time_share": shares,
        "machine": training_machine(),
    }
    write_record(out, result)
    print("time: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    print(
        f"kept the {cfg.keep} actor; best eval QoS {best:.3f} (SQF {reference['qos']:.3f}); "
        f"ONNX parity max |diff| {diff:.2e}; exported {out / 'actor.onnx'}"
    )
    return result


def progress(step: int, steps: int, done: int, seconds: float) -> str:
    """A run's progress line: its step, this session's rate and the time left at it."""
    rate = done / seconds if seconds > 0 else 0.0
    left = f"about {(steps - step) / rate / 60:.0f} min to go" if rate > 0 else "starting"
    return f"step {step:>7}  {rate:6.0f} steps/s  {left}"


def kept_last(step: int, history: list[dict[str, Any]]) -> dict[str, object]:
    """A record's note that its actor is the final step's, and that step's evaluation."""
    return {"kept": "last", "kept_step": step, "kept_eval_qos": history[-1]["qos"]}


def export_last(run: Path, out: Path) -> dict[str, object]:
    """The final actor of `run`'s checkpoint, rather than its best-evaluated one,
    exported to `out` with the run's record marked `kept: last` (the step, and the
    evaluation there). Picking the best of many noisy evaluations favours a lucky
    checkpoint; the last one is what training converged to, chosen without looking at
    any evaluation. The run's own folder is left as it was."""
    if out.resolve() == run.resolve():
        raise ValueError("the last actor goes to another folder than its run's")
    ckpt = run / "checkpoint.pt"
    if not ckpt.exists():
        raise ValueError(f"{run} has no checkpoint (they are not committed)")
    state = torch.load(ckpt, weights_only=False)
    cfg = TrainConfig.from_record(state["config"])
    sac = SAC(cfg.sac(), experts=cfg.most_experts)
    sac.load_state_dict(state["sac"])
    out.mkdir(parents=True, exist_ok=True)
    export_actor(sac.actor, out / "actor.onnx", cfg.speed_prior)
    record = {
        **read_record(run),
        **kept_last(state["step"], state["history"]),
        "onnx_parity_max_abs": parity(sac.actor, out / "actor.onnx"),
    }
    write_record(out, record)
    return record
