"""Export the actor (encoder + head) as one ONNX graph, and check it against PyTorch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from edgeroute.qos.model import QoSNet
from policies.qos_state import F_EXPERT, F_REQ, INPUTS


def example(batch: int, n: int, queue: int = 5, seed: int = 0) -> dict[str, np.ndarray]:
    """Random, plausible states with ragged queues and padded experts."""
    rng = np.random.default_rng(seed)
    ex_mask = np.ones((batch, n), np.float32)
    ex_mask[:, n - 1] = rng.integers(0, 2, batch)  # some states pad the last expert
    return {
        "arrived": rng.random((batch, F_REQ), np.float32),
        "experts": rng.random((batch, n, F_EXPERT), np.float32),
        "running": rng.random((batch, n, queue, F_REQ), np.float32),
        "waiting": rng.random((batch, n, queue, F_REQ), np.float32),
        "expert_mask": ex_mask,
        "running_mask": (rng.random((batch, n, queue)) < 0.6).astype(np.float32),
        "waiting_mask": (rng.random((batch, n, queue)) < 0.3).astype(np.float32),
    }


def export_actor(actor: QoSNet, path: Path) -> None:
    actor.eval()
    inputs = example(2, 6)
    args = tuple(torch.from_numpy(inputs[k]) for k in INPUTS)
    dynamic = {
        "arrived": {0: "batch"},
        "experts": {0: "batch", 1: "experts"},
        "running": {0: "batch", 1: "experts"},
        "waiting": {0: "batch", 1: "experts"},
        "expert_mask": {0: "batch", 1: "experts"},
        "running_mask": {0: "batch", 1: "experts"},
        "waiting_mask": {0: "batch", 1: "experts"},
        "logits": {0: "batch"},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        actor,
        args,
        str(path),
        input_names=list(INPUTS),
        output_names=["logits"],
        dynamic_axes=dynamic,
        opset_version=17,
        dynamo=False,
    )


def parity(
    actor: QoSNet, path: Path, n_values: tuple[int, ...] = (3, 6, 12), batch: int = 64
) -> float:
    """The largest |PyTorch - onnxruntime| over random states, for several N."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    actor.eval()
    for i, n in enumerate(n_values):
        inputs = example(batch, n, seed=i)
        with torch.no_grad():
            want = actor(*(torch.from_numpy(inputs[k]) for k in INPUTS)).numpy()
        names = {i.name for i in session.get_inputs()}  # unused inputs are pruned
        got = session.run(["logits"], {k: v for k, v in inputs.items() if k in names})[0]
        valid = np.concatenate([np.ones((batch, 1)), inputs["expert_mask"]], axis=1) > 0
        worst = max(worst, float(np.abs(want - got)[valid].max()))
    return worst
