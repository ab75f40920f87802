"""The router's network: padding- and permutation-invariant, exportable, trainable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from edgeroute.qos.export import example, export_actor, parity
from edgeroute.qos.model import QoSNet
from edgeroute.qos.train import TrainConfig, train
from policies.qos_state import INPUTS
from tests.support import DATA_DIR, needs_data


def logits(net: QoSNet, obs: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        return net(*(torch.from_numpy(obs[k]) for k in INPUTS)).numpy()


@pytest.mark.parametrize("encoder", ["han", "experts"])
def test_padding_experts_changes_nothing_for_the_real_ones(encoder: str) -> None:
    torch.manual_seed(0)
    net = QoSNet(encoder).eval()
    obs = example(4, 5, seed=1)
    obs["expert_mask"][:] = 1.0
    padded = {
        k: np.concatenate([v, np.zeros((4, 3, *v.shape[2:]), np.float32)], axis=1)
        if v.ndim >= 2 and k != "arrived"
        else v
        for k, v in obs.items()
    }
    a, b = logits(net, obs), logits(net, padded)
    assert np.allclose(a, b[:, :6], atol=1e-5)
    assert (b[:, 6:] < -1e8).all()  # padded experts can never be chosen


def test_permuting_experts_permutes_their_logits() -> None:
    torch.manual_seed(0)
    net = QoSNet().eval()
    obs = example(3, 6, seed=2)
    obs["expert_mask"][:] = 1.0
    perm = np.array([3, 0, 5, 1, 4, 2])
    shuffled = {k: (v[:, perm] if k != "arrived" else v) for k, v in obs.items()}
    a, b = logits(net, obs), logits(net, shuffled)
    assert np.allclose(a[:, 0], b[:, 0], atol=1e-5)  # drop
    assert np.allclose(a[:, 1:][:, perm], b[:, 1:], atol=1e-5)


@pytest.mark.parametrize("encoder", ["han", "experts"])
def test_onnx_export_matches_pytorch_for_several_n(tmp_path: Path, encoder: str) -> None:
    # The expert-feature encoder ignores the queues: the export prunes those inputs.
    torch.manual_seed(0)
    net = QoSNet(encoder)
    export_actor(net, tmp_path / "actor.onnx")
    assert parity(net, tmp_path / "actor.onnx", n_values=(3, 6, 12)) < 1e-4


@needs_data("the quality data")
def test_a_tiny_training_run_trains_exports_and_checks_parity(tmp_path: Path) -> None:
    result = train(
        TrainConfig(steps=240, warmup=60, eval_every=120, eval_seeds=(7,), threads=1),
        DATA_DIR,
        tmp_path,
    )
    assert (tmp_path / "actor.onnx").exists() and (tmp_path / "best_actor.pt").exists()
    assert result["onnx_parity_max_abs"] < 1e-4  # type: ignore[operator]
    history = result["history"]
    assert len(history) == 2 and all(np.isfinite(h["loss_q"]) for h in history)  # type: ignore[index, union-attr]
