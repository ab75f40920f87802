"""An ONNX graph's nodes and constants under construction: what the QoS router's
served graphs are written with, at export (`edgeroute.qos.onnx_graph`) and when the
policy joins them (`policies.qos_graph`). It needs the `onnx` package."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

OPSET = 17
# The IR of opset 17's release (onnx 1.12). Written explicitly: onnx writes its own
# newest IR by default, which an onnxruntime a release behind refuses to load.
IR_VERSION = 8
FLOAT, INT64, BOOL, DOUBLE = 1, 7, 9, 11  # onnx.TensorProto's element types


class Nodes:
    """Nodes, each output named anew, and named constants; every name after `prefix`."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.nodes: list[Any] = []  # onnx.NodeProto
        self.constants: dict[str, np.ndarray] = {}

    def const(
        self, name: str, value: np.ndarray | Sequence[Any] | float, dtype: type | None = None
    ) -> str:
        """A constant: int64 for integers and float32 for the rest unless `dtype` says."""
        array = np.asarray(value)
        if dtype is None:
            dtype = np.int64 if array.dtype.kind == "i" else np.float32
        self.constants[self.prefix + name] = array.astype(dtype)
        return self.prefix + name

    def op(self, op_type: str, *inputs: str, name: str = "", **attrs: Any) -> str:
        """A node with one output, named `name` as given or anew."""
        return self.ops(op_type, *inputs, outputs=1, name=name, **attrs)[0]

    def ops(
        self, op_type: str, *inputs: str, outputs: int, name: str = "", **attrs: Any
    ) -> list[str]:
        """A node with `outputs` outputs."""
        from onnx import helper

        base = name or f"{self.prefix}{op_type.lower()}_{len(self.nodes)}"
        names = [base] if outputs == 1 else [f"{base}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names

    def initializers(self) -> list[Any]:
        """The constants as onnx.TensorProto."""
        from onnx import numpy_helper

        return [numpy_helper.from_array(v, k) for k, v in self.constants.items()]
