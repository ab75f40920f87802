"""Export the actor (encoder + head) as one ONNX graph, and check it against PyTorch."""

from __future__ import annotations

import re
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
        "queues": rng.random((batch, n, 2, queue, F_REQ), np.float32),
        "expert_mask": ex_mask,
        # running queues fuller than waiting ones
        "queue_mask": (rng.random((batch, n, 2, queue)) < [[0.6], [0.3]]).astype(np.float32),
    }


def export_actor(actor: QoSNet, path: Path) -> None:
    actor.eval()
    inputs = example(2, 6)
    args = tuple(torch.from_numpy(inputs[k]) for k in INPUTS)
    dynamic = {
        "arrived": {0: "batch"},
        "experts": {0: "batch", 1: "experts"},
        "queues": {0: "batch", 1: "experts"},
        "expert_mask": {0: "batch", 1: "experts"},
        "queue_mask": {0: "batch", 1: "experts"},
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
        # Weights keep their names (onnxruntime folds the constants when it loads), so
        # `load_actor` can read them back.
        do_constant_folding=False,
        opset_version=17,
        dynamo=False,
    )


def load_actor(path: Path, config: dict[str, object]) -> QoSNet:
    """An exported actor's weights back in PyTorch, for re-exporting it when the
    graph's form changes (training checkpoints are not committed). `config` is its
    training record's (`encoder` variant, hidden, heads, layers). Weights the exporter
    renamed (Linear layers run as MatMul, transposed) are found by their node's name."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    actor = QoSNet(
        "experts" if config["variant"] == "baseline" else "han",
        int(str(config["hidden"])),
        int(str(config["heads"])),
        int(str(config["layers"])),
    )
    modules = dict(actor.named_modules())
    found = {k: torch.from_numpy(v.copy()) for k, v in values.items() if k in actor.state_dict()}
    for node in model.graph.node:
        for given in node.input:
            if node.op_type == "MatMul" and given.startswith("onnx::") and given in values:
                found[_module_of(node.name, modules) + ".weight"] = torch.from_numpy(
                    values[given].T.copy()
                )
    unused = {k for k in actor.state_dict() if k not in found}
    # A last layer's request updates feed nothing the heads read: the export drops them.
    if any(".req_" not in k for k in unused):
        raise ValueError(f"{path}: no weights found for {sorted(unused)}")
    try:
        actor.load_state_dict({**actor.state_dict(), **found})
    except RuntimeError as e:  # shapes that are not this config's
        raise ValueError(f"{path}: its weights do not fit the config: {e}") from None
    return actor


def _module_of(node: str, modules: dict[str, torch.nn.Module]) -> str:
    """The module a traced node ran in: "/head/expert/expert.0/MatMul" is head.expert.0
    (a Sequential's children repeat its name), "/encoder/in_req_1/MatMul" is
    encoder.in_req called a second time."""
    path: list[str] = []
    for part in node.strip("/").split("/")[:-1]:
        if path and part.startswith(path[-1] + "."):
            part = part[len(path[-1]) + 1 :]
        if ".".join([*path, part]) not in modules:
            part = re.sub(r"_\d+$", "", part)
        path.append(part)
    return ".".join(path)


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
