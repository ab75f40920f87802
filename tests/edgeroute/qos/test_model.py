"""The router's network: padding- and permutation-invariant, exportable, trainable."""

from __future__ import annotations

import filecmp
import json
import typing
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from edgeroute.cli import main
from edgeroute.qos import train as training
from edgeroute.qos.config import (
    QUALITIES,
    SWEEP_LATENCIES_MS,
    SWEEP_RATES,
    TrainConfig,
    quality_flag,
    quality_suffix,
    read_record,
    trained_fleet,
)
from edgeroute.qos.evaluate import Policy
from edgeroute.qos.export import example, export_actor, load_actor, parity
from edgeroute.qos.model import NEG, NodeAttention, QoSNet, queue_attention
from edgeroute.qos.sac import SAC, Replay, batch_of
from edgeroute.qos.train import eval_settings, export_last, progress, train
from edgeroute.sim.edge import EdgeEnv, Fleet, Quality
from policies.predictor import MODEL_ROOT
from policies.qos_state import INPUTS
from tests.support import DATA_DIR, needs_data


def logits(net: QoSNet, obs: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        out: np.ndarray = net(*(torch.from_numpy(obs[k]) for k in INPUTS)).numpy()
    return out


PER_REQUEST = ("arrived", "load")  # of the inputs, those not per expert


@pytest.mark.parametrize("encoder", ["han", "experts"])
@pytest.mark.parametrize("load", [False, True])
def test_padding_experts_changes_nothing_for_the_real_ones(encoder: str, load: bool) -> None:
    torch.manual_seed(0)
    net = QoSNet(encoder, load=load).eval()
    obs = example(4, 5, seed=1)
    obs["expert_mask"][:] = 1.0
    padded = {
        k: np.concatenate([v, np.zeros((4, 3, *v.shape[2:]), np.float32)], axis=1)
        if k not in PER_REQUEST
        else v
        for k, v in obs.items()
    }
    a, b = logits(net, obs), logits(net, padded)
    assert np.allclose(a, b[:, :6], atol=1e-5)
    assert (b[:, 6:] < -1e8).all()  # padded experts can never be chosen


@pytest.mark.parametrize("load", [False, True])
def test_permuting_experts_permutes_their_logits(load: bool) -> None:
    torch.manual_seed(0)
    net = QoSNet(load=load).eval()
    obs = example(3, 6, seed=2)
    obs["expert_mask"][:] = 1.0
    perm = np.array([3, 0, 5, 1, 4, 2])
    shuffled = {k: (v[:, perm] if k not in PER_REQUEST else v) for k, v in obs.items()}
    a, b = logits(net, obs), logits(net, shuffled)
    assert np.allclose(a[:, 0], b[:, 0], atol=1e-5)  # drop
    assert np.allclose(a[:, 1:][:, perm], b[:, 1:], atol=1e-5)


@pytest.mark.parametrize("encoder", ["han", "experts"])
@pytest.mark.parametrize("load", [False, True])
def test_onnx_export_matches_pytorch_for_several_n(
    tmp_path: Path, encoder: str, load: bool
) -> None:
    # The expert-feature encoder ignores the queues: the export prunes those inputs.
    torch.manual_seed(0)
    net = QoSNet(encoder, load=load)
    export_actor(net, tmp_path / "actor.onnx")
    assert parity(net, tmp_path / "actor.onnx", n_values=(3, 6, 12)) < 1e-4
    session = ort.InferenceSession(str(tmp_path / "actor.onnx"))
    assert ("load" in {i.name for i in session.get_inputs()}) == load


@pytest.mark.parametrize("encoder", ["han", "experts"])
@pytest.mark.parametrize("load", [False, True])
def test_an_encoder_reads_the_load_only_when_built_to(encoder: str, load: bool) -> None:
    torch.manual_seed(0)
    net = QoSNet(encoder, load=load).eval()
    obs = example(4, 5, seed=4)
    heavier = {**obs, "load": obs["load"] + 1.0}
    changed = np.abs(logits(net, obs) - logits(net, heavier)).max()
    assert (changed > 1e-4) == load


@pytest.mark.parametrize("encoder", ["han", "experts"])
def test_a_critic_built_to_read_the_load_alone_leaves_the_shared_encoder_without_it(
    encoder: str,
) -> None:
    torch.manual_seed(0)
    cfg = TrainConfig(variant="baseline" if encoder == "experts" else "full")
    sac = SAC(replace(cfg, critic_arrival_rate=True).sac(), experts=5)
    obs = example(4, 5, seed=4)
    heavier = {**obs, "load": obs["load"] + 1.0}

    def both(o: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            q1, _ = sac.critic(*batch_of(o))
        return logits(sac.actor, o), q1.numpy()

    (pi, q), (pi_heavier, q_heavier) = both(obs), both(heavier)
    assert np.abs(q - q_heavier).max() > 1e-4
    assert np.array_equal(pi, pi_heavier)
    assert sac.actor.encoder is sac.critic.encoder


@needs_data("the quality data")
def test_a_run_whose_critic_alone_reads_the_load_serves_an_actor_without_it(
    tmp_path: Path,
) -> None:
    result = train(tiny(critic_arrival_rate=True), DATA_DIR, tmp_path)
    assert result["onnx_parity_max_abs"] < 1e-4  # type: ignore[operator]
    # The record names the processor (rebuilds are bit for bit only on the same kind).
    assert read_record(tmp_path)["machine"]["cpu_capability"] == (
        torch.backends.cpu.get_cpu_capability()
    )
    session = ort.InferenceSession(str(tmp_path / "actor.onnx"))
    assert "load" not in {i.name for i in session.get_inputs()}
    critic = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["sac"]["critic"]
    assert critic["in_load.weight"].abs().sum() > 0


def test_without_herded_starts_an_episode_starts_as_it_always_did() -> None:
    from edgeroute.qos.train import Herd, herded_start

    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    assert herded_start(TrainConfig(), rng, 6) == Herd()
    assert rng.bit_generator.state == before  # committed runs rebuild bit for bit
    with pytest.raises(ValueError, match="share of episodes"):
        TrainConfig(herded_starts=1.5)


@needs_data("the quality data")
def test_a_herded_start_sends_an_episodes_first_decisions_to_one_expert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every episode herded for longer than it lasts: each episode's transitions (one
    environment, credited as they happen, so stored in order) all hold one expert, not
    always the same."""
    import edgeroute.qos.train as training

    monkeypatch.setattr(training, "HERD_DECISIONS", 10_000)
    cfg = tiny(herded_starts=1.0, envs=1, episode_len=16, credit="completion")
    train(cfg, DATA_DIR, tmp_path)
    actions = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["replay"]["action"]
    episodes = np.asarray(actions).reshape(-1, 16)
    assert len(episodes) == 16
    assert all(len(set(e.tolist())) == 1 for e in episodes)
    assert episodes.min() >= 1 and len(set(episodes[:, 0].tolist())) > 1
    # and at a share of 0, the same run acts as the actor says
    train(replace(cfg, herded_starts=0.0), DATA_DIR, tmp_path / "free")
    free = torch.load(tmp_path / "free" / "checkpoint.pt", weights_only=False)["replay"]["action"]
    assert not all(len(set(e.tolist())) == 1 for e in np.asarray(free).reshape(-1, 16))


@pytest.mark.parametrize("layers", [1, 2])
def test_the_written_graph_is_the_module_with_the_papers_two_layers_too(
    tmp_path: Path, layers: int
) -> None:
    """The served graph folds projections into one another: every fold must hold with
    a second layer (its queues are embeddings, not features) and 4 heads as well."""
    torch.manual_seed(layers)
    net = QoSNet("han", 64, 4, layers)
    export_actor(net, tmp_path / "actor.onnx")
    assert parity(net, tmp_path / "actor.onnx", n_values=(1, 5, 12)) < 1e-4


@pytest.mark.parametrize("world", ["", "routerdc"])
def test_the_shipped_actor_is_what_the_exporter_writes_from_its_weights(
    tmp_path: Path, world: str
) -> None:
    folder = MODEL_ROOT / world
    record = json.loads((folder / "runs" / "full-s1" / "training.json").read_text())
    actor = load_actor(folder / "actor.onnx", record["config"])
    export_actor(actor, tmp_path / "actor.onnx")
    assert filecmp.cmp(tmp_path / "actor.onnx", folder / "actor.onnx", shallow=False)


def test_queue_attention_is_each_relations_node_attention() -> None:
    """Batching the running and waiting queues, and folding the embedding into the
    keys and values, computes what the two NodeAttention modules would on embedded
    requests, empty queues included."""
    torch.manual_seed(0)
    run, wait, embed = NodeAttention(32, 2), NodeAttention(32, 2), torch.nn.Linear(6, 32)
    obs = example(8, 5, seed=3)
    target = torch.randn(8, 5, 32)
    queues, mask = torch.from_numpy(obs["queues"]), torch.from_numpy(obs["queue_mask"])
    mask[:, 0, 1] = 0.0  # an expert with nothing waiting
    with torch.no_grad():
        got = queue_attention((run, wait), target, queues, mask, embed)
        want = torch.stack(
            [m(target, embed(queues[:, :, r]), mask[:, :, r]) for r, m in enumerate((run, wait))],
            dim=2,
        )
    assert torch.allclose(got, want, atol=1e-5)
    assert got[:, 0, 1].abs().max() == 0.0


@pytest.mark.parametrize("variant", ["full", "baseline"])
def test_an_exported_actor_reads_back_into_pytorch(tmp_path: Path, variant: str) -> None:
    config = TrainConfig(variant=variant)
    torch.manual_seed(1)
    net = QoSNet(config.sac().encoder, config.hidden, config.heads, config.layers)
    export_actor(net, tmp_path / "actor.onnx")
    back = load_actor(tmp_path / "actor.onnx", vars(config))
    obs = example(16, 6, seed=4)
    assert np.allclose(logits(net.eval(), obs), logits(back.eval(), obs), atol=1e-6)
    other = "baseline" if variant == "full" else "full"
    with pytest.raises(ValueError, match=r"no weights|do not fit"):
        load_actor(tmp_path / "actor.onnx", {**vars(config), "variant": other})
    with pytest.raises(ValueError, match="do not fit"):
        load_actor(tmp_path / "actor.onnx", {**vars(config), "hidden": 16})


def tiny(**kw: object) -> TrainConfig:
    return TrainConfig(
        **{"steps": 256, "warmup": 64, "envs": 4, "eval_every": 128, "eval_episodes": 1, **kw}  # type: ignore[arg-type]
    )


@needs_data("the quality data")
@pytest.mark.parametrize("quality", ["routerbench", "routerdc"])
def test_a_tiny_training_run_trains_exports_and_checks_parity(tmp_path: Path, quality: str) -> None:
    result = train(tiny(quality=quality), DATA_DIR, tmp_path)
    assert (tmp_path / "actor.onnx").exists() and (tmp_path / "best_actor.pt").exists()
    assert result["onnx_parity_max_abs"] < 1e-4  # type: ignore[operator]
    history = result["history"]
    assert isinstance(history, list) and len(history) == 2
    assert all(np.isfinite(h["loss_q"]) for h in history)


@needs_data("the quality data")
def test_the_evaluation_by_draws_leaves_training_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each evaluation is also acted by draws from the policy (`qos_drawn`), on a
    generator of its own: a run whose drawn evaluations act not at all must train the
    same actor and evaluate it the same by argmax."""
    from edgeroute.qos import train as training

    cfg = tiny(select_on="default")
    measured = train(cfg, DATA_DIR, tmp_path / "measured")
    history = typing.cast(list[dict[str, float]], measured["history"])
    assert all(0 <= h["qos_drawn"] <= 1 for h in history)

    real_acting, real_eval = training.acting, training.eval_score
    drawn_policies = []

    def acting(sac: typing.Any, greedy: bool, rng: np.random.Generator) -> Policy:
        policy = real_acting(sac, greedy, rng)
        if not greedy:
            drawn_policies.append(policy)
        return policy

    def eval_score(env: typing.Any, c: TrainConfig, policy: Policy) -> dict[str, float]:
        if policy in drawn_policies:
            return {"qos": 0.0, "latency_ms": 0.0, "drop_rate": 0.0}
        return real_eval(env, c, policy)

    monkeypatch.setattr(training, "acting", acting)
    monkeypatch.setattr(training, "eval_score", eval_score)
    skipped = train(cfg, DATA_DIR, tmp_path / "skipped")
    assert len(drawn_policies) == len(history)
    without = typing.cast(list[dict[str, float]], skipped["history"])
    assert [h["qos"] for h in without] == [h["qos"] for h in history]
    runs = ("measured", "skipped")
    a, b = (torch.load(tmp_path / run / "checkpoint.pt", weights_only=False) for run in runs)
    assert (a["replay"]["action"] == b["replay"]["action"]).all()  # every action taken
    critic_a, critic_b = a["sac"]["critic"], b["sac"]["critic"]
    assert all(torch.equal(critic_a[k], critic_b[k]) for k in critic_a)


@needs_data("the quality data")
def test_an_agent_trained_without_the_drop_never_drops(tmp_path: Path) -> None:
    """`drop=False`: no drop is ever taken in training (warm-up included), the target
    entropy is over the experts alone, and the exported actor's drop logit is NEG
    whatever the state, so served with shedding on it still never sheds."""
    cfg = tiny(drop=False)
    assert SAC(cfg.sac(), experts=6).target_entropy[6] == pytest.approx(0.5 * np.log(6))
    assert SAC(tiny().sac(), experts=6).target_entropy[6] == pytest.approx(0.5 * np.log(7))
    train(cfg, DATA_DIR, tmp_path)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    actions = np.asarray(ckpt["replay"]["action"])
    assert len(actions) > 0 and actions.min() >= 1
    session = ort.InferenceSession(str(tmp_path / "actor.onnx"))
    obs = example(32, 6, seed=5)
    names = {i.name for i in session.get_inputs()}
    out = session.run(["logits"], {k: v for k, v in obs.items() if k in names})[0]
    assert (out[:, 0] <= NEG / 2).all() and (out[:, 1:] > NEG / 2).all()
    # trained with the drop, the same run does take it
    train(tiny(), DATA_DIR, tmp_path / "with")
    with_drop = torch.load(tmp_path / "with" / "checkpoint.pt", weights_only=False)
    assert np.asarray(with_drop["replay"]["action"]).min() == 0


@needs_data("the quality data")
def test_hindsight_credit_on_episodes_longer_than_the_warm_up_trains(tmp_path: Path) -> None:
    """In hindsight, routed requests' transitions reach the replay only when their
    episode ends (drops at once, so none here); with episodes longer than the whole
    run no update can sample, and the run still ends with an exported actor rather
    than sampling an empty replay."""
    cfg = tiny(impact="hindsight", episode_len=1000, drop=False)
    result = train(cfg, DATA_DIR, tmp_path)
    assert (tmp_path / "actor.onnx").exists()
    history = result["history"]
    assert isinstance(history, list) and all("loss_q" not in h for h in history)


@needs_data("the quality data")
def test_a_stopped_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """The first run stops at 128 steps; the second, asked for 256, carries on from
    its checkpoint (learner, optimisers, replay and history) instead of starting over."""
    train(tiny(steps=128), DATA_DIR, tmp_path)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert ckpt["step"] == 128 and len(ckpt["replay"]["action"]) > 0
    result = train(tiny(steps=256), DATA_DIR, tmp_path)
    history = result["history"]
    assert isinstance(history, list) and [h["step"] for h in history] == [128, 256]
    with pytest.raises(SystemExit, match="another config"):
        train(tiny(steps=384, lr=1e-3), DATA_DIR, tmp_path)  # not the same run


def test_a_progress_line_gives_the_rate_and_the_time_left() -> None:
    assert (
        progress(150_000, 300_000, 30_000, 600.0)
        == "step  150000      50 steps/s  about 50 min to go"
    )
    assert progress(0, 300_000, 0, 0.0).endswith("starting")


@needs_data("the quality data")
def test_a_run_shows_progress_between_its_evaluations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With evaluations far apart a run still prints where it is (here at every step,
    the interval set to 0), and not on the steps that print an evaluation."""
    monkeypatch.setattr(training, "PROGRESS_SECONDS", 0.0)
    train(tiny(steps=128, eval_every=128), DATA_DIR, tmp_path)
    lines = capsys.readouterr().out.splitlines()
    shown = [int(x.split()[1]) for x in lines if "min to go" in x or x.endswith("starting")]
    assert shown == list(range(4, 128, 4))  # four environments: four steps a round
    assert sum(x.startswith("step ") and "eval QoS" in x for x in lines) == 1


@needs_data("the quality data")
def test_a_stopped_run_finishes_at_its_checkpoint_but_not_before_it(tmp_path: Path) -> None:
    """A run stopped at a checkpoint is finished there by asking for as many steps as it
    has (its record and actor are written without training on); asking for fewer is
    refused, since the record would then claim fewer steps than the actor had."""
    train(tiny(steps=256), DATA_DIR, tmp_path)
    (tmp_path / "training.json").unlink()
    (tmp_path / "actor.onnx").unlink()
    with pytest.raises(SystemExit, match="at step 256, past the 128 asked for"):
        train(tiny(steps=128), DATA_DIR, tmp_path)
    assert not (tmp_path / "actor.onnx").exists()
    result = train(tiny(steps=256, keep="last"), DATA_DIR, tmp_path)
    history = result["history"]
    assert isinstance(history, list) and [h["step"] for h in history] == [128, 256]
    assert result["kept_step"] == 256 and (tmp_path / "actor.onnx").exists()
    assert read_record(tmp_path)["config"]["steps"] == 256


@needs_data("the quality data")
def test_the_last_actor_is_the_checkpoints_exported_beside_the_run(tmp_path: Path) -> None:
    """`export_last` writes the checkpoint's actor, not the best-evaluated one, with the
    run's record marked as such, and leaves the run's folder as it was."""
    run, out = tmp_path / "run", tmp_path / "last"
    train(tiny(steps=256, fleet=Fleet(hardware_ms=(10.0, 40.0))), DATA_DIR, run)
    # a best actor unlike the last, so that exporting it instead would show
    best = torch.load(run / "best_actor.pt")
    torch.save({k: torch.zeros_like(v) for k, v in best.items()}, run / "best_actor.pt")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    record = export_last(run, out)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert record["kept"] == "last" and record["kept_step"] == 256
    assert record["kept_eval_qos"] == read_record(run)["history"][-1]["qos"]
    assert record["onnx_parity_max_abs"] < 1e-4  # type: ignore[operator]
    assert read_record(out) == record and trained_fleet(out) == trained_fleet(run)
    # the checkpoint's actor: its encoder is the critic's, its head the actor's own
    state = torch.load(run / "checkpoint.pt", weights_only=False)["sac"]
    exported = load_actor(out / "actor.onnx", record["config"]).state_dict()  # type: ignore[arg-type]
    for name, value in state["actor_head"].items():
        assert torch.allclose(exported[f"head.{name}"], value)
    for name, value in exported.items():
        if name.startswith("encoder."):
            assert torch.allclose(value, state["critic"][name])


@needs_data("the quality data")
def test_a_run_that_keeps_its_last_actor_exports_what_qos_last_would(tmp_path: Path) -> None:
    """`keep="last"` exports the final step's actor in the run itself: the very graph
    `export_last` writes from its checkpoint, with the same note in the record."""
    run = tmp_path / "run"
    result = train(tiny(steps=256, keep="last"), DATA_DIR, run)
    record = export_last(run, tmp_path / "after")
    assert (run / "actor.onnx").read_bytes() == (tmp_path / "after" / "actor.onnx").read_bytes()
    assert result["kept"] == record["kept"] == "last"
    assert result["kept_step"] == record["kept_step"] == 256
    assert result["kept_eval_qos"] == record["kept_eval_qos"] == result["history"][-1]["qos"]  # type: ignore[index]
    # and one that keeps its best does not say it kept the last
    assert "kept" not in train(tiny(steps=128), DATA_DIR, tmp_path / "best")


def test_a_run_keeps_its_best_or_its_last_actor_and_nothing_else() -> None:
    with pytest.raises(ValueError, match="best or last actor, not 'first'"):
        tiny(keep="first")


@needs_data("the quality data")
def test_a_run_resumed_may_keep_another_actor_but_not_change_its_training(
    tmp_path: Path,
) -> None:
    train(tiny(steps=128), DATA_DIR, tmp_path)
    result = train(tiny(steps=256, keep="last"), DATA_DIR, tmp_path)
    assert result["kept"] == "last" and result["kept_step"] == 256


@needs_data("the quality data")
def test_the_last_actor_needs_a_checkpoint_and_a_folder_of_its_own(tmp_path: Path) -> None:
    train(tiny(steps=128), DATA_DIR, tmp_path)
    with pytest.raises(ValueError, match="another folder"):
        export_last(tmp_path, tmp_path / ".")
    (tmp_path / "checkpoint.pt").unlink()
    with pytest.raises(ValueError, match="no checkpoint"):
        export_last(tmp_path, tmp_path / "last")
    with pytest.raises(SystemExit, match=r"edgeroute train qos-last: .* no checkpoint"):
        main(["train", "qos-last", str(tmp_path), "--out", str(tmp_path / "last")])
    assert not (tmp_path / "last").exists()


@needs_data("the quality data")
def test_a_checkpoint_from_before_the_fleet_setting_resumes(tmp_path: Path) -> None:
    """Checkpoints written before the fleet was one setting hold its fields flat; such
    a run carries on, and one of another fleet does not."""
    big = Fleet(hardware_ms=(20.0, 40.0), running_cap=64, waiting_cap=1000, memory_tokens=40_000)
    train(tiny(steps=128, fleet=big), DATA_DIR, tmp_path)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    config = dict(ckpt["config"])
    ckpt["config"] = {**{k: v for k, v in config.items() if k != "fleet"}, **asdict(big)}
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    with pytest.raises(SystemExit, match="another config"):
        train(tiny(steps=256, fleet=replace(big, running_cap=5)), DATA_DIR, tmp_path)
    result = train(tiny(steps=256, fleet=big), DATA_DIR, tmp_path)
    history = result["history"]
    assert isinstance(history, list) and [h["step"] for h in history] == [128, 256]


@needs_data("the quality data")
def test_a_checkpoint_from_before_the_replay_size_setting_resumes(tmp_path: Path) -> None:
    """Checkpoints written before the replay's size was a setting do not name it; such a
    run carries on with the size it had, and not with another."""
    train(tiny(steps=128), DATA_DIR, tmp_path)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    ckpt["config"] = {k: v for k, v in ckpt["config"].items() if k != "buffer"}
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    with pytest.raises(SystemExit, match="another config"):
        train(tiny(steps=256, buffer=1000), DATA_DIR, tmp_path)
    result = train(tiny(steps=256), DATA_DIR, tmp_path)
    history = result["history"]
    assert isinstance(history, list) and [h["step"] for h in history] == [128, 256]


@needs_data("the quality data")
def test_a_decision_is_credited_with_its_own_requests_qos(tmp_path: Path) -> None:
    """Per-request credit: a routed request's transition waits for it to finish and
    then carries its QoS less the impact penalty; a drop is stored at once at 0."""
    from edgeroute.qos.sac import Replay
    from edgeroute.qos.train import Pending, make_env

    env = make_env(tiny(), DATA_DIR)
    obs = env.observe()
    replay = Replay(64, obs)
    pending = Pending(replay)
    env.step(0)
    pending.add(env, obs, 0, env.observe(), False)
    assert replay.size == 1 and replay.reward[0] == 0.0
    env.step(1)
    routed = env.last_request
    assert routed is not None
    pending.add(env, obs, 1, env.observe(), False)
    pending.settle(env)
    assert replay.size == 1  # still generating
    env.drain()
    pending.settle(env)
    assert replay.size == 2 and not pending.waiting
    assert replay.reward[1] == pytest.approx(env.qos(routed) - env.last_penalty)


def test_sweep_selection_scores_each_point_of_the_benchmarks_sweep_once() -> None:
    points = eval_settings(TrainConfig(select_on="sweep"))
    assert points[0] == (5.0, 30.0) and len(set(points)) == len(points) == 8
    assert {r for r, lat in points if lat == 30.0} == {5.0, *SWEEP_RATES}
    assert {lat for r, lat in points if r == 5.0} == {30.0, *SWEEP_LATENCIES_MS}
    assert eval_settings(TrainConfig()) == [(5.0, 30.0)] * 4


def test_the_qualities_the_commands_offer_are_the_simulators() -> None:
    assert typing.get_args(Quality) == QUALITIES
    assert quality_suffix("routerbench") == "" and quality_flag("routerdc") == " --quality routerdc"


@needs_data("the quality data")
@pytest.mark.parametrize(
    ("setting", "configured", "paper"),
    [("latencies_ms", (12.0, 15.0), (20.0, 40.0)), ("rates", (8.5, 10.0), (3.0, 8.0))],
)
def test_episodes_draw_their_setting_from_the_configured_range(
    setting: str, configured: tuple[float, float], paper: tuple[float, float]
) -> None:
    from edgeroute.qos.train import make_env, new_episode

    def drawn(env: EdgeEnv) -> float:  # L in ms, or lambda per second
        return env.L * 1000 if setting == "latencies_ms" else env.rate

    cfg = tiny(**{setting: configured})
    env = make_env(cfg, DATA_DIR)
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(20):
        new_episode(env, cfg, rng)
        draws.append(drawn(env))
    low, high = configured
    assert all(low <= x <= high for x in draws) and len(set(draws)) == 20
    new_episode(env, tiny(), rng)
    assert paper[0] <= drawn(env) <= paper[1]  # the paper's sweep by default


def test_without_a_fleet_range_an_episode_draws_no_fleet_size() -> None:
    from edgeroute.qos.train import fleet_size

    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    assert fleet_size(TrainConfig(experts=5), rng) == 5
    assert rng.bit_generator.state == before  # committed runs rebuild bit for bit
    assert TrainConfig(experts=5).most_experts == 5
    assert TrainConfig(experts_range=(3, 12)).most_experts == 12
    for bad in ((0, 4), (5, 3), (2.5, 4)):
        with pytest.raises(ValueError, match="expected N from 1"):
            TrainConfig(experts_range=bad)  # type: ignore[arg-type]


@needs_data("the quality data")
def test_episodes_draw_their_fleet_size_and_observations_pad_to_the_largest() -> None:
    from edgeroute.qos.train import make_env, new_episode, observed

    cfg = tiny(experts_range=(3, 7))
    env = make_env(cfg, DATA_DIR)
    rng = np.random.default_rng(0)
    sizes = []
    for _ in range(40):
        new_episode(env, cfg, rng)
        sizes.append(len(env.experts))
        obs = observed(env, cfg)
        assert obs["experts"].shape[0] == 7 and obs["expert_mask"].sum() == len(env.experts)
    assert set(sizes) == {3, 4, 5, 6, 7}


def test_the_target_entropy_is_a_share_of_each_fleets_most() -> None:
    """A batch mixing fleet sizes tunes the temperature towards each sample's own
    target: at the target entropy for its size, a sample pulls alpha neither way."""
    sac = SAC(TrainConfig(drop=False, experts_range=(2, 8)).sac(), experts=8)
    assert sac.target_entropy[3] == pytest.approx(0.5 * np.log(3))
    assert sac.target_entropy[8] == pytest.approx(0.5 * np.log(8))
    with_drop = SAC(TrainConfig().sac(), experts=8)
    assert with_drop.target_entropy[3] == pytest.approx(0.5 * np.log(4))


@needs_data("the quality data")
def test_a_run_over_fleet_sizes_trains_on_each_and_acts_within_each_fleet(
    tmp_path: Path,
) -> None:
    """Transitions of several fleet sizes share one replay; no action, in the warm-up
    or after it, names an expert its episode's fleet does not have."""
    cfg = tiny(experts_range=(2, 5), drop=False, credit="completion", episode_len=16)
    result = train(cfg, DATA_DIR, tmp_path)
    assert result["onnx_parity_max_abs"] < 1e-4  # type: ignore[operator]
    replay = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["replay"]
    sizes = replay["obs"]["expert_mask"].sum(-1)
    assert replay["obs"]["expert_mask"].shape[1] == 5 and set(sizes.tolist()) == {2, 3, 4, 5}
    actions = np.asarray(replay["action"])
    assert actions.min() >= 1 and (actions <= sizes).all()
    assert (actions[cfg.warmup :] <= sizes[cfg.warmup :]).all()


def test_the_arrival_rate_range_is_low_then_high() -> None:
    with pytest.raises(ValueError, match="expected lambda per second low then high"):
        tiny(rates=(10.0, 3.0))
    with pytest.raises(ValueError, match="expected lambda per second low then high"):
        tiny(rates=(0.0, 3.0))


@needs_data("the quality data")
def test_episodes_can_draw_their_latency_target_over_the_fastest_expert() -> None:
    from edgeroute.qos.train import make_env, new_episode

    cfg = tiny(latency_over_fastest=(1.0, 1.3), fleet=Fleet(hardware_ms=(10.0, 40.0)))
    env = make_env(cfg, DATA_DIR)
    rng = np.random.default_rng(0)
    ratios, fastest, only_fastest = [], set(), 0
    for _ in range(20):
        new_episode(env, cfg, rng)
        bases = sorted(e.base for e in env.specs)
        ratios.append(env.L / bases[0])
        fastest.add(bases[0])
        only_fastest += bases[0] <= env.L < bases[1]
    # each episode's own fleet sets the scale, and some targets only its fastest can meet
    assert all(1.0 <= r <= 1.3 for r in ratios) and len(fastest) > 1
    assert len(set(ratios)) == 20
    assert only_fastest > 0


def test_latency_factors_are_low_then_high() -> None:
    with pytest.raises(ValueError, match="low then high"):
        tiny(latency_over_fastest=(2.0, 1.0))
    with pytest.raises(ValueError, match="low then high"):
        tiny(latency_over_fastest=(0.0, 1.0))


def test_the_latency_range_is_low_then_high() -> None:
    # the command line refuses such a range too (`positive_range`); a config built in
    # code, as the tests and benchmarks build them, is held to it here
    with pytest.raises(ValueError, match="expected L in ms low then high"):
        tiny(latencies_ms=(40.0, 20.0))
    with pytest.raises(ValueError, match="expected L in ms low then high"):
        tiny(latencies_ms=(0.0, 20.0))
    assert tiny(latencies_ms=(25.0, 25.0)).latencies_ms == (25.0, 25.0)


def test_a_runs_latency_range_is_read_from_its_record(tmp_path: Path) -> None:
    from edgeroute.qos.config import trained_latencies

    wide = Path(__file__).parents[3] / "models/qos/routerdc/attempts/wide-L/full-s0"
    assert trained_latencies(wide) == "[15, 40] ms"
    (tmp_path / "training.json").write_text('{"config": {"variant": "full"}}')
    assert trained_latencies(tmp_path) == "[20, 40] ms"  # a record from before the setting
    assert trained_latencies(tmp_path / "none") == "[20, 40] ms"
    (tmp_path / "training.json").write_text(
        '{"config": {"latencies_ms": [20, 40], "latency_over_fastest": [1, 2]}}'
    )
    assert trained_latencies(tmp_path) == "[1, 2] times the fastest expert's ms per iteration"


@needs_data("the quality data")
def test_episodes_draw_their_hardware_from_the_configured_range() -> None:
    from edgeroute.qos.train import make_env, new_episode

    env = make_env(tiny(fleet=Fleet(hardware_ms=(30.0, 40.0))), DATA_DIR)
    rng = np.random.default_rng(0)
    bases = []
    for _ in range(10):
        new_episode(env, tiny(fleet=Fleet(hardware_ms=(30.0, 40.0))), rng)
        bases += [spec.base for spec in env.specs]
    assert all(0.030 <= b <= 0.040 for b in bases) and len(set(bases)) == len(bases)
    new_episode(env, tiny(), rng)
    assert all(0.010 <= spec.base <= 0.022 for spec in env.specs)  # the benchmark's by default


@needs_data("the quality data")
def test_training_experts_take_the_configured_waiting_cap() -> None:
    from edgeroute.qos.train import make_env, new_episode

    env = make_env(tiny(fleet=Fleet(waiting_cap=1000)), DATA_DIR)
    new_episode(env, tiny(fleet=Fleet(waiting_cap=1000)), np.random.default_rng(0))
    assert {spec.waiting_cap for spec in env.specs} == {1000}
    for _ in range(20):  # more arrivals than 5 waiting slots, all to expert 1
        env.step(1)
    assert env.dropped == 0 and len(env.experts[0].waiting) > 5
    new_episode(env, tiny(), np.random.default_rng(0))
    assert {spec.waiting_cap for spec in env.specs} == {5}  # the paper's by default


@needs_data("the quality data")
def test_training_experts_take_the_configured_batch_and_memory() -> None:
    """`--running-cap`, `--memory-tokens`: the live engines' regime, where a batch holds
    many requests and each one added slows all of them."""
    from edgeroute.qos.train import make_env, new_episode

    big = tiny(fleet=Fleet(running_cap=64, memory_tokens=40_000, waiting_cap=1000))
    env = make_env(big, DATA_DIR)
    new_episode(env, big, np.random.default_rng(0))
    assert {(s.running_cap, s.memory_tokens) for s in env.specs} == {(64, 40_000)}
    for _ in range(30):  # arrivals faster than one expert finishes them
        env.step(1)
    e = env.experts[0]
    assert len(e.running) + len(e.fresh) > 5 and env.dropped == 0
    new_episode(env, tiny(), np.random.default_rng(0))
    assert {s.running_cap for s in env.specs} == {5}  # the paper's by default
    assert len({s.memory_tokens for s in env.specs}) > 1  # each hardware seed's own


def test_a_hardware_seed_keeps_its_other_constants_whatever_the_base_range() -> None:
    from edgeroute.sim.edge import default_experts

    usual = default_experts(6, 7)
    slow = default_experts(6, 7, fleet=Fleet(hardware_ms=(30.0, 40.0)))
    assert [e.base for e in usual] != [e.base for e in slow]
    assert [(e.k1, e.k2, e.memory_tokens) for e in usual] == [
        (e.k1, e.k2, e.memory_tokens) for e in slow
    ]


def test_a_runs_fleet_is_read_from_its_record(tmp_path: Path) -> None:
    from edgeroute.qos.config import trained_fleet

    record = tmp_path / "training.json"
    big = Fleet(hardware_ms=(20.0, 40.0), running_cap=256, waiting_cap=1000, memory_tokens=40_000)
    record.write_text(json.dumps({"config": asdict(TrainConfig(fleet=big))}))
    assert trained_fleet(tmp_path) == big
    # records from before the fleet was one setting: its fields flat, None for the paper's
    flat = {"hardware_ms": [20.0, 40.0], "running_cap": 256, "memory_tokens": 40_000}
    record.write_text(json.dumps({"config": {**flat, "waiting_cap": 1000}}))
    assert trained_fleet(tmp_path) == big
    record.write_text('{"config": {"hardware_ms": null, "variant": "full"}}')
    assert trained_fleet(tmp_path) == Fleet()


@needs_data("the quality data")
def test_training_with_the_counterfactual_impact_credits_the_true_cost() -> None:
    """`--impact counterfactual`: a routed decision's transition carries its request's
    QoS less what it truly cost the expert's other requests (rarely anything: only a
    request near L can be tipped over it; two experts kept loaded find some)."""
    from edgeroute.qos.sac import Replay
    from edgeroute.qos.train import Pending, make_env, new_episode

    cfg = tiny(impact="counterfactual", latencies_ms=(30.0, 40.0))
    env = make_env(cfg, DATA_DIR)
    assert env.impact == "counterfactual"
    new_episode(env, cfg, np.random.default_rng(0))
    obs = env.observe()
    pending = Pending(Replay(4096, obs))
    costs = {}
    for i in range(400):
        action = 1 + i % 2
        cost = env.counterfactual_impact(action - 1, env.request_for(action - 1))
        env.step(action)
        if env.last_request is not None:
            assert env.last_penalty == pytest.approx(cost)
            costs[id(env.last_request)] = (env.last_request, cost)
        pending.add(env, obs, action, obs, False)
    env.drain()
    pending.settle(env)
    assert any(c > 0 for _, c in costs.values()) and all(c >= 0 for _, c in costs.values())
    assert pending.replay.size == 400 and not pending.waiting
    rewards = sorted(pending.replay.reward[: pending.replay.size].tolist())
    want = sorted([0.0] * (400 - len(costs)) + [env.qos(r) - c for r, c in costs.values()])
    assert rewards == pytest.approx(want, abs=1e-6)


@needs_data("the quality data")
@pytest.mark.parametrize(
    ("impact", "weights", "scale"),
    [
        ("hindsight", {}, 1.0),
        ("shared", {}, 1.0),
        ("hindsight", {"impact_scale": 3.0}, 3.0),
        # weighed by the load: an episode at lambda = 8, the top of the rates, gets HEAVY
        ("hindsight", {"impact_scale_by_rate": (0.5, 1.5), "rates": (3.0, 8.0)}, 1.5),
    ],
)
def test_training_with_a_hindsight_impact_credits_at_the_episodes_end(
    impact: str, weights: dict[str, typing.Any], scale: float
) -> None:
    """`--impact hindsight` and `shared`: nothing is stored while the episode runs (a
    decision's cost depends on requests routed after it); at its end every routed
    decision carries its request's QoS less what that request truly cost the others,
    arrivals included (shared: each loss divided among the requests that caused it),
    times the penalty's weight (`--impact-scale`, `--impact-scale-by-rate`)."""
    from edgeroute.qos.sac import Replay
    from edgeroute.qos.train import Pending, make_env, new_episode

    cfg = tiny(impact=impact, latencies_ms=(30.0, 40.0), **weights)
    env = make_env(cfg, DATA_DIR)
    new_episode(env, cfg, np.random.default_rng(0))
    env.reset(rate=8.0)
    obs = env.observe()
    pending = Pending(Replay(4096, obs), cfg.impact_weight)
    drops = 0
    for i in range(400):
        action = (1 + i % 2) if i % 7 else 0
        env.step(action)
        drops += env.last_request is None
        pending.add(env, obs, action, obs, False)
        pending.settle(env)
    assert pending.replay.size == drops  # only the drops, at 0
    env.drain()
    routed = [item[0] for item in pending.waiting]
    charges = env.hindsight_charges()
    costs = [charges[r].shared if impact == "shared" else env.hindsight_impact(r) for r in routed]
    pending.settle(env, ended=True)
    assert pending.replay.size == 400 and not pending.waiting
    assert any(c > 0 for c in costs)
    rewards = sorted(pending.replay.reward[: pending.replay.size].tolist())
    want = sorted(
        [0.0] * drops + [env.qos(r) - scale * c for r, c in zip(routed, costs, strict=True)]
    )
    assert rewards == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("impact", ["hindsight", "shared"])
def test_a_hindsight_impact_is_refused_with_completion_credit(impact: str) -> None:
    with pytest.raises(ValueError, match="credited per request"):
        TrainConfig(impact=impact, credit="completion")


def test_completion_credit_weighs_the_penalty_its_reward_holds() -> None:
    from edgeroute.qos.train import weighed

    assert weighed(0.7, 0.2, 1.0) == 0.7  # eq. 16 as written: the reward as it is
    assert weighed(0.7, 0.2, 3.0) == pytest.approx(0.7 - 2 * 0.2)
    assert weighed(0.7, 0.2, 0.0) == pytest.approx(0.9)  # no penalty at all


def test_the_impact_weight_can_follow_the_episodes_load() -> None:
    """`--impact-scale-by-rate LIGHT,HEAVY`: the weight scaled by LIGHT at the bottom
    of the rates drawn, HEAVY at the top, linear between and held beyond."""
    cfg = TrainConfig(rates=(3.0, 8.0), impact_scale_by_rate=(0.5, 1.5))
    assert cfg.impact_weight(3.0) == 0.5 and cfg.impact_weight(8.0) == 1.5
    assert cfg.impact_weight(5.5) == pytest.approx(1.0)
    assert cfg.impact_weight(10.0) == 1.5 and cfg.impact_weight(1.0) == 0.5
    assert TrainConfig(impact_scale=2.0).impact_weight(7.0) == 2.0
    assert cfg.flags() == " --impact-scale-by-rate 0.5,1.5"
    assert TrainConfig.from_record({"variant": "full", "impact_scale_by_rate": [0.5, 1.5]}) == cfg
    both = TrainConfig(rates=(3.0, 8.0), impact_scale=2.0, impact_scale_by_rate=(0.5, 1.5))
    assert both.impact_weight(3.0) == 1.0 and both.impact_weight(8.0) == 3.0
    with pytest.raises(ValueError):
        TrainConfig(impact_scale_by_rate=(1.5, 0.5))


@needs_data("the quality data")
def test_training_weighs_each_episodes_penalty_by_its_own_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short run with the weight following the load: training hands its credit the
    config's weight, read at the lambda of each episode it settles (that the credit
    uses it is the hindsight credit test's case by load)."""
    seen: list[tuple[float, float]] = []
    settle = training.Pending.settle

    def watched(self: training.Pending, env: EdgeEnv, ended: bool = False) -> None:
        seen.append((env.rate, self.impact_weight(env.rate)))
        settle(self, env, ended)

    monkeypatch.setattr(training.Pending, "settle", watched)
    cfg = tiny(impact="hindsight", impact_scale_by_rate=(0.5, 1.5), episode_len=40)
    train(cfg, DATA_DIR, tmp_path)
    assert len({rate for rate, _ in seen}) > 4  # several episodes, each its own lambda
    assert all(weight == pytest.approx(cfg.impact_weight(rate)) for rate, weight in seen)


def test_the_impact_penalty_is_never_weighed_below_0() -> None:
    with pytest.raises(ValueError, match="at least 0"):
        TrainConfig(impact_scale=-1.0)
    assert TrainConfig(impact_scale=2.0).flags() == " --impact-scale 2"
    assert TrainConfig.from_record({"variant": "full"}).impact_scale == 1.0


def test_the_discount_is_a_setting_that_reaches_the_critics_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With every reward 0 and no episode ending, the critic's target is gamma times
    the next state's soft value: two SACs alike but for gamma give targets in that
    ratio."""
    with pytest.raises(ValueError, match="discount"):
        TrainConfig(gamma=1.0)
    assert TrainConfig(gamma=0.9).flags() == " --gamma 0.9"
    assert TrainConfig.from_record({"variant": "full"}).gamma == 0.99
    assert TrainConfig(gamma=0.9).sac().gamma == 0.9

    obs = {k: v[0] for k, v in example(1, 3, seed=5).items()}
    targets: list[torch.Tensor] = []
    mse = torch.nn.functional.mse_loss

    def spy(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        targets.append(target.detach().clone())
        return mse(x, target)

    monkeypatch.setattr(torch.nn.functional, "mse_loss", spy)
    for gamma in (0.99, 0.5):
        torch.manual_seed(0)
        sac = SAC(TrainConfig(gamma=gamma).sac(), experts=3)
        replay = Replay(8, obs)
        for _ in range(8):
            replay.add(obs, 1, 0.0, obs, False)
        sac.update(replay, np.random.default_rng(0))
    at_099, at_05 = targets[0], targets[2]  # each update computes two critics' losses
    assert torch.count_nonzero(at_099) > 0
    assert torch.allclose(at_05, at_099 * (0.5 / 0.99), rtol=1e-5)


def test_a_run_with_its_own_predictor_must_be_written_under_it(tmp_path: Path) -> None:
    """An actor is served with the nearest predictor above its folder, so a run that
    trains with another predictor is refused anywhere else."""
    from edgeroute.qos.config import TrainConfig
    from edgeroute.qos.predictors import reread_predictor
    from edgeroute.qos.train import check_served_predictor
    from policies.predictor import MODEL_ROOT

    folder = tmp_path / "expected-read"
    folder.mkdir()
    reread_predictor(MODEL_ROOT / "routerdc", folder, "expected")
    cfg = TrainConfig(quality="routerdc", predictor=str(folder))
    check_served_predictor(cfg, folder / "runs" / "full-s0")
    with pytest.raises(SystemExit, match="train it into a folder under"):
        check_served_predictor(cfg, tmp_path / "elsewhere")
    check_served_predictor(TrainConfig(quality="routerdc"), tmp_path / "elsewhere")


@needs_data("the quality data")
def test_a_share_of_episodes_reads_windows_of_a_trace_with_its_token_counts(
    tmp_path: Path,
) -> None:
    """`trace_share` 0.5 with a trace in the data folder's form: about half the episodes
    read a window of it (their requests carry the trace's sizes), the others are
    Poisson over the agent's prompts; at share 0 no episode draws anything more, so
    configs without a trace train as before. A share without a trace is refused."""
    from edgeroute.qos.train import make_env, new_episode, training_trace
    from tests.support import write_trace

    write_trace(tmp_path / "t.csv", 2_000)  # every request 100 tokens in, 10 out
    cfg = tiny(trace="t.csv", trace_share=0.5, episode_len=32)
    trace = training_trace(cfg, tmp_path)
    assert len(trace) == 2_000
    env = make_env(cfg, DATA_DIR)
    rng = np.random.default_rng(0)
    from_trace = 0
    for _ in range(40):
        new_episode(env, cfg, rng, trace)
        sizes = set()
        for _ in range(8):
            sizes.add((env.task.prompt_tokens, env.task.lengths[env.specs[0].model]))
            env.step(1)
        from_trace += sizes == {(100, 10)}
    assert 10 <= from_trace <= 30
    # at share 0 a trace changes nothing: the same draws, the same episode
    plain = tiny(episode_len=32)
    with_trace, without = np.random.default_rng(5), np.random.default_rng(5)
    new_episode(env, plain, with_trace, trace)
    reference = make_env(plain, DATA_DIR)
    new_episode(reference, plain, without)
    assert with_trace.bit_generator.state == without.bit_generator.state
    assert (env.rate, env.L, env.task) == (reference.rate, reference.L, reference.task)
    assert training_trace(plain, tmp_path) == []
    with pytest.raises(ValueError, match="needs a trace"):
        tiny(trace_share=0.2)
    write_trace(tmp_path / "short.csv", 34)
    with pytest.raises(ValueError, match="holds 34 requests; an episode of 32"):
        training_trace(tiny(trace="short.csv", trace_share=0.5, episode_len=32), tmp_path)
