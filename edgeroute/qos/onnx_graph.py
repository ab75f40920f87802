"""Serving graphs written node by node (the QoS actor and predictor).

onnxruntime spends ~2 us per node on this machine whatever the node's size, and a
traced PyTorch module spends many of its nodes on shape bookkeeping, so the served
graphs are written by hand from the trained weights, with the linear maps that meet
before a nonlinearity multiplied out beforehand (numpy, float64). The module's own
parameters ride along as ONNX training information, which inference ignores, so a
later export can read them back (`parameters`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from policies.onnx_nodes import IR_VERSION, OPSET, Nodes


class Graph(Nodes):
    """An ONNX graph under construction (`policies.onnx_nodes.Nodes`) that saves as a
    model carrying the module's parameters."""

    def save(
        self,
        path: Path,
        name: str,
        inputs: Mapping[str, tuple[int, Sequence[int | str]]],
        outputs: Mapping[str, tuple[str, int, Sequence[int | str]]],
        params: Mapping[str, np.ndarray],
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """Write the graph: `inputs` {name: (element type, shape)}, `outputs` {name:
        (the node output it is, element type, shape)}, the module's `params`, and the
        model's `metadata` (ONNX metadata_props)."""
        import onnx
        from onnx import helper, numpy_helper

        nodes = [*self.nodes]
        nodes += [
            helper.make_node("Identity", [src], [out]) for out, (src, _, _) in outputs.items()
        ]
        graph = helper.make_graph(
            nodes,
            name,
            [helper.make_tensor_value_info(k, t, s) for k, (t, s) in inputs.items()],
            [helper.make_tensor_value_info(k, t, s) for k, (_, t, s) in outputs.items()],
            self.initializers(),
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
        )
        info = onnx.TrainingInfoProto()
        info.initialization.CopyFrom(
            helper.make_graph(
                [],
                "parameters",
                [],
                [],
                [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()],
            )
        )
        model.training_info.append(info)
        helper.set_model_props(model, dict(metadata or {}))
        onnx.checker.check_model(model)
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))


def parameters(path: Path) -> dict[str, np.ndarray]:
    """The module parameters a graph written by `Graph.save` carries."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    return {
        t.name: numpy_helper.to_array(t)
        for info in model.training_info
        for t in info.initialization.initializer
    }


def linear(w: Mapping[str, np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray]:
    """A torch Linear's weight as [in, out], and its bias."""
    return w[name + ".weight"].T, w[name + ".bias"]


def weights(module: object) -> dict[str, np.ndarray]:
    """A torch module's parameters as float64 arrays, for folding."""
    return {k: v.detach().numpy().astype(np.float64) for k, v in module.state_dict().items()}  # type: ignore[attr-defined]
