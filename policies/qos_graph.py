"""The served QoS decision as one ONNX graph: the predictor, the features that depend on
its predictions or on the clock, and the actor, joined when the policy loads.

Served as three steps (the predictor's run, `policies.qos_state.encode` in numpy, the
actor's run), a decision spent much of its time in Python and numpy calls that each do
little. Joined, Python hands the graph what it keeps per backend (the packed rows of
`policies.qos_state.snapshot` and each expert's own figures) and the prompt's ids, and
one run returns the actor's logits and the predictions. The joining nodes are
`encode`'s arithmetic in the same order and precision, so the joined decision is the
three-step one: `encode` stays the definition (training uses it) and the tests hold
the graph to it.

Inputs:
- `ids` [1, T] int64: the prompt's grams (`policies.qos_text.gram_ids`);
- `model` [N] int64: each candidate's model in the predictor's list, or the list's
  length for a model it does not know (predicted as the mean of all, as
  `ScorePredictor.predict` does);
- `scalars` [1, 3] float64: the prompt's tokens, the clock, the latency target L (s);
- `experts_own` [1, N, F_EXPERT] float32: `policies.qos_state.expert_columns` with
  zeros where the predictions go;
- `packed` [1, N, 2, QUEUE_CAP, F_REQ + 3] float64: each backend's packed rows (only
  for an actor that reads the queues);
- `load` [1, 1] float32: `policies.qos_state.load_feature`, passed to the actor as it is
  (only for an actor that reads it).
Outputs: `logits` [1, N + 1] and `preds` [N, 2] float64 (score, length in tokens).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from policies.onnx_nodes import DOUBLE, FLOAT, INT64, IR_VERSION, OPSET, Nodes
from policies.predictor import LENGTH_MIDPOINTS, MAX_TOKENS, SCORE_MIDPOINTS
from policies.qos_state import F_EXPERT, F_REQ, PER_TOKEN_CAP, PREDICTION_COLUMN, QUEUE_CAP

_PREDICTOR = "predictor/"  # the predictor's names, apart from the actor's
# The arrays of `policies.qos_state.encode` a served actor may read: what the join feeds.
SERVED_INPUTS = ("arrived", "experts", "queues", "queue_mask", "load")
# An actor's metadata key, "true" when it was trained reading unmeasured experts at the
# mean measured speed (`qos_state.with_speed_prior`): it is then always served so.
TRAINED_WITH_SPEED_PRIOR = "speed_prior"


def joined(actor_path: Path, predictor_path: Path) -> bytes:
    """The decision graph of an actor and a predictor file, serialised for
    onnxruntime. An actor that reads only some of `encode`'s arrays (Baseline RL reads
    the experts' alone) gets those alone."""
    import onnx
    from onnx import compose, helper

    actor = onnx.load(str(actor_path))
    predictor = compose.add_prefix(onnx.load(str(predictor_path)), _PREDICTOR)
    wanted = {i.name for i in actor.graph.input}
    if unknown := wanted - set(SERVED_INPUTS):
        raise ValueError(
            f"{actor_path} reads {', '.join(sorted(unknown))}: a served actor reads only "
            f"{', '.join(SERVED_INPUTS)}"
        )
    table = [t for t in predictor.graph.initializer if t.name == _PREDICTOR + "expert_rows"]
    reads = {i.name.removeprefix(_PREDICTOR) for i in predictor.graph.input}
    if not table or reads != {"ids", "expert"}:
        raise ValueError(f"{predictor_path} is not a predictor of prompt ids and experts")
    models = table[0].dims[0]
    g = Nodes("join/")
    # The predictor on every model it knows; its buckets' midpoints as
    # `policies.predictor` has them, and their mean as the unknown model's row.
    feeds = {
        _PREDICTOR + "ids": "ids",
        _PREDICTOR + "expert": g.const("every_model", np.arange(models)),
    }
    for node in predictor.graph.node:
        node.input[:] = [feeds.get(x, x) for x in node.input]
    g.nodes.extend(predictor.graph.node)
    midpoints = g.const("midpoints", SCORE_MIDPOINTS + LENGTH_MIDPOINTS, np.float64)
    column = g.const("column", [0, len(SCORE_MIDPOINTS)])
    known = g.op("Gather", midpoints, g.op("Add", _PREDICTOR + "buckets", column))
    every = g.op("Concat", known, g.op("ReduceMean", known, axes=[0], keepdims=1), axis=0)
    preds = g.op("Gather", every, "model", axis=0, name="preds")
    inputs = [
        helper.make_tensor_value_info("ids", INT64, [1, "tokens"]),
        helper.make_tensor_value_info("model", INT64, ["experts"]),
        helper.make_tensor_value_info("experts_own", FLOAT, [1, "experts", F_EXPERT]),
    ]
    # the predictions as encode scales them: the score as it is, the length / MAX_TOKENS
    per_length = g.const("per_length", [1.0, MAX_TOKENS], np.float64)
    if "arrived" in wanted or "queues" in wanted:
        inputs.append(helper.make_tensor_value_info("scalars", DOUBLE, [1, 3]))
        prompt, now, latency = g.ops("Split", "scalars", outputs=3, axis=1)
    if "arrived" in wanted:
        # prompt tokens / 1000, the mean prediction (its length / MAX_TOKENS), zeros
        mean = g.op("Div", g.op("ReduceMean", preds, axes=[0], keepdims=1), per_length)
        thousands = g.op("Div", prompt, g.const("thousand", 1000.0, np.float64))
        arrived = g.op("Concat", thousands, mean, g.const("zeros", [[0.0] * 3], np.float64), axis=1)
        g.op("Cast", arrived, to=FLOAT, name="arrived")
    if "experts" in wanted:
        predicted = g.op("Cast", g.op("Div", preds, per_length), to=FLOAT)
        after = F_EXPERT - PREDICTION_COLUMN - 2
        pads = g.const("pads", [0, PREDICTION_COLUMN, 0, after])
        g.op("Add", "experts_own", g.op("Pad", predicted, pads), name="experts")
    if "queues" in wanted or "queue_mask" in wanted:
        inputs.append(
            helper.make_tensor_value_info("packed", DOUBLE, [1, "experts", 2, QUEUE_CAP, F_REQ + 3])
        )
        sizes = g.const("packed_split", [F_REQ - 1, 1, 1, 1, 1])
        rows, _, started, tokens, present = g.ops("Split", "packed", sizes, outputs=5, axis=4)
        if "queues" in wanted:
            # encode's latency per token so far: (now - started), at least 0, / tokens,
            # / L, capped, zero where no request is
            per_token = g.op("Max", g.op("Sub", now, started), g.const("zero", 0.0, np.float64))
            per_token = g.op("Div", g.op("Div", per_token, tokens), latency)
            per_token = g.op("Min", per_token, g.const("cap", PER_TOKEN_CAP, np.float64))
            per_token = g.op("Mul", per_token, present)
            g.op("Cast", g.op("Concat", rows, per_token, axis=4), to=FLOAT, name="queues")
        if "queue_mask" in wanted:
            mask = g.op("Squeeze", present, g.const("last_axis", [4]))
            g.op("Cast", mask, to=FLOAT, name="queue_mask")
    if "load" in wanted:
        inputs.append(helper.make_tensor_value_info("load", FLOAT, [1, 1]))
    g.nodes.extend(actor.graph.node)
    outputs = [
        helper.make_tensor_value_info("logits", FLOAT, [1, None]),
        helper.make_tensor_value_info("preds", DOUBLE, [None, 2]),
    ]
    constants = [*g.initializers(), *predictor.graph.initializer, *actor.graph.initializer]
    graph = helper.make_graph(g.nodes, "qos_decision", inputs, outputs, constants)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    model.metadata_props.extend(actor.metadata_props)
    return bytes(model.SerializeToString())
