"""Several training runs of one agent served as one actor: the mean of their policies.

An ensemble's `actor.onnx` reads what its members read and returns, as its logits, the
log of the mean of their action probabilities: a softmax of them is that mean, and
their argmax is the action the members' average puts first. The gateway and the
simulator serve it as any other actor (`policies.qos_drl` joins the predictor to it
at load), so nothing downstream knows it is several.

Why: a reward's training runs differ, and a run served by its argmax now and then
piles every request onto one engine (docs/research.md, "Several training runs served
as one"). In the mean of several, a run that herds is outvoted. Each member costs its
own actor's nodes per decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeroute.qos.config import read_record, write_record
from policies.onnx_nodes import FLOAT, IR_VERSION, OPSET, Nodes

ACTOR = "actor.onnx"
# What members of one ensemble may differ in: their seed, and where and how the run
# was kept.
MAY_DIFFER = frozenset({"seed", "out", "keep"})


def ensemble_graph(actors: Sequence[Path]) -> bytes:
    """One actor graph of `actors` (their `actor.onnx` files), serialised: the same
    inputs, and `logits` [batch, actions] = log(mean over members of softmax(logits)).
    The members must read the same inputs and carry the same metadata."""
    import onnx
    from onnx import compose, helper

    if not actors:
        raise ValueError("an ensemble needs at least one actor")
    models = [onnx.load(str(p)) for p in actors]
    first = models[0]
    names = [i.name for i in first.graph.input]
    meta = {p.key: p.value for p in first.metadata_props}
    for path, model in zip(actors, models, strict=True):
        if [i.name for i in model.graph.input] != names:
            raise ValueError(f"{path} reads other inputs than {actors[0]}")
        if {p.key: p.value for p in model.metadata_props} != meta:
            raise ValueError(f"{path}'s metadata differs from {actors[0]}'s")
        if [o.name for o in model.graph.output] != ["logits"]:
            raise ValueError(f"{path} is not an actor (its output is not `logits`)")
    g = Nodes("ensemble/")
    nodes: list[Any] = []
    constants: list[Any] = []
    log_probs = []
    for k, model in enumerate(models):
        prefix = f"member{k}/"
        model.ClearField("training_info")  # the trainable parameters' copy: not served
        member = compose.add_prefix(model, prefix)
        shared = {prefix + n: n for n in names}
        for node in member.graph.node:
            node.input[:] = [shared.get(x, x) for x in node.input]
        nodes.extend(member.graph.node)
        constants.extend(member.graph.initializer)
        log_probs.append(g.op("LogSoftmax", prefix + "logits", axis=-1))
    # log of the mean: logsumexp over the members, less log(members)
    first_axis = g.const("first_axis", [0])
    stacked = g.op("Concat", *[g.op("Unsqueeze", lp, first_axis) for lp in log_probs], axis=0)
    summed = g.op("ReduceLogSumExp", stacked, axes=[0], keepdims=0)
    g.op("Sub", summed, g.const("log_members", np.log(len(models))), name="logits")
    graph = helper.make_graph(
        [*nodes, *g.nodes],
        "qos_actor_ensemble",
        list(first.graph.input),
        [helper.make_tensor_value_info("logits", FLOAT, ["batch", "actions"])],
        [*constants, *g.initializers()],
    )
    out = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    helper.set_model_props(out, meta)
    onnx.checker.check_model(out)
    return bytes(out.SerializeToString())


def common_config(
    records: Mapping[Path, dict[str, Any]], may_differ: frozenset[str] = MAY_DIFFER
) -> dict[str, Any]:
    """The training config that runs' records (by run) share, all but `may_differ`;
    ValueError if they were trained otherwise."""
    runs = list(records)
    configs = [records[r]["config"] for r in runs]
    shared = {k: v for k, v in configs[0].items() if k not in may_differ}
    for run, config in zip(runs, configs, strict=True):
        own = {k: v for k, v in config.items() if k not in may_differ}
        if own != shared:
            differ = sorted(k for k in own.keys() | shared.keys() if own.get(k) != shared.get(k))
            raise ValueError(f"{run} was trained otherwise than {runs[0]}: {', '.join(differ)}")
    return shared


def write_ensemble(runs: Sequence[Path], out: Path, commit: str) -> dict[str, Any]:
    """`out/actor.onnx`, the ensemble of `runs` (training runs of one config but their
    seeds), and its record: the members, their seeds and commits, and the config they
    share. Returns the record."""
    records = {r: read_record(r) for r in runs}
    config = common_config(records)
    out.mkdir(parents=True, exist_ok=True)
    (out / ACTOR).write_bytes(ensemble_graph([r / ACTOR for r in runs]))
    record = {
        "commit": commit,
        "ensemble": {
            "members": [str(r) for r in runs],
            "seeds": [rec["config"].get("seed") for rec in records.values()],
            "commits": [rec.get("commit") for rec in records.values()],
            "combined": "log of the mean of the members' action probabilities",
        },
        "config": config,
    }
    write_record(out, record)
    return record


__all__ = ["ACTOR", "common_config", "ensemble_graph", "write_ensemble"]
