"""The graph builder both served QoS graphs are written with."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import helper

from policies.onnx_nodes import DOUBLE, OPSET, Nodes


def test_constants_take_their_type_and_every_output_its_own_name() -> None:
    g = Nodes("join/")
    assert g.const("ids", [1, 2]) == "join/ids" and g.constants["join/ids"].dtype == np.int64
    assert g.constants[g.const("scale", 0.5)].dtype == np.float32
    assert g.constants[g.const("exact", 0.1, np.float64)].dtype == np.float64
    first, second = g.ops("Split", "x", outputs=2, axis=0)
    assert len({first, second, g.op("Add", first, second), g.op("Add", first, second)}) == 4
    assert g.op("Neg", second, name="y") == "y"


def test_a_graph_built_with_it_runs() -> None:
    g = Nodes("p/")
    half = g.op("Mul", "x", g.const("half", 0.5, np.float64))
    g.op("Sub", half, g.const("one", 1.0, np.float64), name="y")
    graph = helper.make_graph(
        g.nodes,
        "g",
        [helper.make_tensor_value_info("x", DOUBLE, [2])],
        [helper.make_tensor_value_info("y", DOUBLE, [2])],
        g.initializers(),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.array([4.0, 0.1])})
    assert y.tolist() == [1.0, 0.1 * 0.5 - 1.0]
