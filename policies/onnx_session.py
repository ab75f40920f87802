"""An onnxruntime session as the QoS graphs are run everywhere: on the CPU, one thread.

One thread because a decision is a few dozen small nodes, where a thread pool's hand-offs
cost more than they share, and because the gateway's event loop and the engines have
the other cores. The gateway's policies, the simulators and training's tools all open
their sessions here, so they run the graphs alike."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnxruntime import InferenceSession


def one_thread_session(model: Path | bytes) -> InferenceSession:
    """An `onnxruntime.InferenceSession` of a model file or its serialised bytes."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
