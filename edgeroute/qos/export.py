"""Export the actor as the ONNX graph the gateway serves, and check it against PyTorch.

Written node by node (`edgeroute.qos.onnx_graph`): 59 nodes where the traced module had
101. Served, every expert is a candidate (the gateway never pads), so the expert mask
drops out, and linear maps that meet before a nonlinearity are multiplied out:

- a query weighs keys only through its dot product with them, so the keys' projection
  folds into the query's (`_query_fold`), and the keys' bias, which shifts every score
  of a softmax alike, drops out;
- an attention's weighted sum of values is its weights times the inputs, then each
  head's value projection (`_value_fold`);
- the first layer's request embedding folds into the queues' keys and values.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from edgeroute.qos.model import NEG, NodeAttention, QoSNet, head_membership
from edgeroute.qos.onnx_graph import Graph, linear, parameters, weights
from policies.onnx_nodes import BOOL, FLOAT
from policies.qos_graph import SERVED_INPUTS, TRAINED_WITH_SPEED_PRIOR
from policies.qos_state import F_EXPERT, F_REQ, INPUTS, QUEUE_CAP


def example(batch: int, n: int, queue: int = QUEUE_CAP, seed: int = 0) -> dict[str, np.ndarray]:
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
        "load": 2 * rng.random((batch, 1), np.float32),
    }


def _member(hidden: int, heads: int) -> np.ndarray:
    """The module's head membership [H, heads], for folding."""
    return head_membership(hidden, heads).double().numpy()


def _query_fold(wq: np.ndarray, bq: np.ndarray, wk: np.ndarray, heads: int) -> np.ndarray:
    """[H + 1, heads * F]: a target's embedding (with a 1 appended for the bias) times
    this gives, per head, the vector whose dot product with a neighbour's F input
    features is that head's score (less the keys' bias: the same for every
    neighbour). wq, wk are [in, H]; wk's in is F."""
    hidden = wq.shape[1]
    member = _member(hidden, heads) / np.sqrt(hidden // heads)
    per_head = member[:, :, None] * wk.T[:, None, :]  # [H (d), heads, F]
    flat = per_head.reshape(hidden, -1)
    return np.vstack([wq @ flat, bq @ flat])


def _value_fold(wv: np.ndarray, bv: np.ndarray | None, heads: int) -> np.ndarray:
    """[heads * F', H]: each head's attention-weighted inputs times this are the heads'
    outputs, side by side. With a bias, F' = F + 1: the inputs carry the weights' sum
    as a last column (0 for an empty queue), which carries the bias."""
    hidden = wv.shape[1]
    member = _member(hidden, heads)  # [H, heads]
    rows = wv if bv is None else np.vstack([wv, bv])  # [F', H]
    out: np.ndarray = (member.T[:, None, :] * rows[None]).reshape(-1, hidden)
    return out


def _queue_attention(
    g: Graph,
    w: dict[str, np.ndarray],
    layer: str,
    target: str,
    x: str,
    mask5: str,
    present: str,
    embed: tuple[np.ndarray, np.ndarray] | None,
    heads: int,
) -> str:
    """Each expert's attention over its running and waiting queues (relations
    run_to_exp, wait_to_exp): target [B, N, H], x [B, N, 2, K, F] -> [B, N, 2, 1, H]."""
    queries, values = [], []
    for rel in ("run_to_exp", "wait_to_exp"):
        wq, bq = linear(w, f"{layer}.{rel}.q")
        wk, _ = linear(w, f"{layer}.{rel}.k")
        wv, bv = linear(w, f"{layer}.{rel}.v")
        if embed is not None:  # (x We + be) W + b = x (We W) + (be W + b)
            we, be = embed
            wk, wv, bv = we @ wk, we @ wv, be @ wv + bv
        queries.append(_query_fold(wq, bq, wk, heads))
        values.append(_value_fold(wv, bv, heads))
    features = queries[0].shape[1] // heads
    fold = np.hstack(queries)  # [H + 1, 2 * heads * F]
    p = g.const(f"{layer}/queue_query", fold[:-1])
    c = g.const(f"{layer}/queue_query_bias", fold[-1])
    per_head = g.op(
        "Reshape",
        g.op("Add", g.op("MatMul", target, p), c),
        g.const(f"{layer}/queue_query_shape", [0, 0, 2, heads, features]),
    )  # [B, N, 2, heads, F]
    xt = g.op("Transpose", x, perm=[0, 1, 2, 4, 3])  # [B, N, 2, F, K]
    scores = g.op("MatMul", per_head, xt)  # [B, N, 2, heads, K]
    scores = g.op("Where", present, scores, g.const("neg", NEG))
    attn = g.op("Mul", g.op("Softmax", scores, axis=-1), mask5)  # empty queues -> 0
    weighted = g.op("MatMul", attn, x)  # [B, N, 2, heads, F]
    total = g.op("ReduceSum", attn, g.const("last_axis", [-1]), keepdims=1)
    both = g.op("Concat", weighted, total, axis=-1)  # [B, N, 2, heads, F + 1]
    flat = g.op(
        "Reshape", both, g.const(f"{layer}/queue_value_shape", [0, 0, 2, 1, heads * (features + 1)])
    )
    return g.op("MatMul", flat, g.const(f"{layer}/queue_value", np.stack(values)))


def _semantic(g: Graph, w: dict[str, np.ndarray], name: str, z: str, axis: int) -> str:
    """HAN's semantic attention over the relations on `axis` of z [..., H], every node
    valid: one weight per relation, from its embeddings averaged over the nodes (axis
    1 when there are several, as for the experts), and the ELU that follows."""
    wp, bp = linear(w, f"{name}.proj")
    t = g.op(
        "Tanh",
        g.op(
            "Add", g.op("MatMul", z, g.const(f"{name}/proj", wp)), g.const(f"{name}/proj_bias", bp)
        ),
    )
    score = g.op("MatMul", t, g.const(f"{name}/q", w[f"{name}.q.weight"].T))  # [..., 1]
    if axis == 2:  # [B, N, R, 1, 1]: averaged over the experts
        score = g.op("ReduceMean", score, axes=[1], keepdims=1)
    beta = g.op("Softmax", score, axis=axis)
    summed_axes = [2, 3] if axis == 2 else [1]
    return g.op(
        "Elu",
        g.op("ReduceSum", g.op("Mul", z, beta), g.const(f"{name}/axes", summed_axes), keepdims=0),
    )


def _han_layer(
    g: Graph,
    w: dict[str, np.ndarray],
    i: int,
    arr: str,
    exp: str,
    x: str,
    masks: tuple[str, str, str],
    embed: tuple[np.ndarray, np.ndarray] | None,
    heads: int,
    last: bool,
) -> tuple[str, str, str]:
    """`edgeroute.qos.model.HANLayer` on arr [B, H], exp [B, N, H] and the queues x
    [B, N, 2, K, F] (the raw features, with `embed` to fold in, in the first layer)."""
    layer = f"encoder.layers.{i}"
    mask5, present, mask6 = masks
    hidden = w[f"{layer}.exp_self.weight"].shape[0]
    from_queues = _queue_attention(g, w, layer, exp, x, mask5, present, embed, heads)
    # The arrived request and the expert itself, as two more relations: [B, N, 2, 1, H].
    wa, ba = linear(w, f"{layer}.arr_to_exp")
    ws, bs = linear(w, f"{layer}.exp_self")
    zeros = np.zeros_like(wa)
    from_arr = g.op(
        "Gemm",
        arr,
        g.const(f"{layer}/arr_to_exp", np.hstack([wa, zeros])),
        g.const(f"{layer}/arr_to_exp_bias", np.concatenate([ba, bs])),
    )
    own = g.op("MatMul", exp, g.const(f"{layer}/exp_self", np.hstack([zeros, ws])))
    others = g.op("Add", own, g.op("Unsqueeze", from_arr, g.const("axis_1", [1])))
    others = g.op("Reshape", others, g.const("relations_shape", [0, 0, 2, 1, hidden]))
    z_exp = g.op("Concat", from_queues, others, axis=2)
    new_exp = _semantic(g, w, f"{layer}.exp_sem", z_exp, axis=2)

    # The arrived request hears every expert (exp_to_arr) and itself.
    rel = f"{layer}.exp_to_arr"
    wq, bq = linear(w, f"{rel}.q")
    wk, _ = linear(w, f"{rel}.k")
    wv, bv = linear(w, f"{rel}.v")
    fold = _query_fold(wq, bq, wk, heads)
    per_head = g.op(
        "Reshape",
        g.op(
            "Gemm", arr, g.const(f"{rel}/query", fold[:-1]), g.const(f"{rel}/query_bias", fold[-1])
        ),
        g.const(f"{rel}/query_shape", [0, heads, hidden]),
    )  # [B, heads, H]
    exp_t = g.op("Transpose", exp, perm=[0, 2, 1])
    attn = g.op("Softmax", g.op("MatMul", per_head, exp_t), axis=-1)  # [B, heads, N]
    weighted = g.op(
        "Reshape", g.op("MatMul", attn, exp), g.const(f"{rel}/flat_shape", [0, heads * hidden])
    )
    # Every weight row sums to 1 (no padded experts): the bias is added once, below.
    wself, bself = linear(w, f"{layer}.arr_self")
    block = np.zeros((heads * hidden + hidden, 2 * hidden))
    block[: heads * hidden, :hidden] = _value_fold(wv, None, heads)
    block[heads * hidden :, hidden:] = wself
    z_arr = g.op(
        "Gemm",
        g.op("Concat", weighted, arr, axis=1),
        g.const(f"{layer}/arr_in", block),
        g.const(f"{layer}/arr_in_bias", np.concatenate([bv, bself])),
    )
    z_arr = g.op("Reshape", z_arr, g.const("arr_relations_shape", [0, 2, hidden]))
    new_arr = _semantic(g, w, f"{layer}.arr_sem", z_arr, axis=1)
    if last:
        return new_arr, new_exp, x
    # The requests hear their expert (its embedding before this layer) and themselves.
    wr, br = linear(w, f"{layer}.req_self")
    if embed is not None:
        we, be = embed
        wr, br = we @ wr, be @ wr + br
    wf, bf = linear(w, f"{layer}.req_from_exp")
    from_exp = g.op(
        "Reshape",
        g.op(
            "Add",
            g.op("MatMul", exp, g.const(f"{layer}/req_from_exp", wf)),
            g.const(f"{layer}/req_from_exp_bias", bf + br),
        ),
        g.const("request_shape", [0, 0, 1, 1, hidden]),
    )
    own_req = g.op("MatMul", x, g.const(f"{layer}/req_self", wr))
    new_req = g.op("Mul", g.op("Elu", g.op("Add", own_req, from_exp)), mask6)
    return new_arr, new_exp, new_req


def _han(g: Graph, w: dict[str, np.ndarray], heads: int, layers: int) -> tuple[str, str]:
    wr, br = linear(w, "encoder.in_req")
    we, be = linear(w, "encoder.in_exp")
    arr = g.op("Gemm", "arrived", g.const("in_req", wr), g.const("in_req_bias", br))
    if "encoder.in_load.weight" in w:
        arr = g.op(
            "Add", arr, g.op("MatMul", "load", g.const("in_load", w["encoder.in_load.weight"].T))
        )
    exp = g.op("Add", g.op("MatMul", "experts", g.const("in_exp", we)), g.const("in_exp_bias", be))
    mask5 = g.op("Unsqueeze", "queue_mask", g.const("axis_3", [3]))  # [B, N, 2, 1, K]
    present = g.op("Cast", mask5, to=BOOL)
    mask6 = g.op("Unsqueeze", "queue_mask", g.const("axis_4", [4])) if layers > 1 else ""
    x = "queues"
    for i in range(layers):
        embed = (wr, br) if i == 0 else None
        arr, exp, x = _han_layer(
            g, w, i, arr, exp, x, (mask5, present, mask6), embed, heads, i == layers - 1
        )
    return arr, exp


def _expert_features(g: Graph, w: dict[str, np.ndarray]) -> tuple[str, str]:
    """Baseline RL's encoder: an MLP on features 0-2 and 5 of each expert (and the load,
    when it reads it), and their mean."""
    w1, b1 = linear(w, "encoder.net.0")
    w2, b2 = linear(w, "encoder.net.2")
    picked = np.zeros((F_EXPERT, w1.shape[1]))
    picked[[0, 1, 2, 5]] = w1[:4]
    first = g.op("MatMul", "experts", g.const("net0", picked))
    if len(w1) > 4:  # the load's part, the same for every expert: [B, 1, H]
        from_load = g.op("MatMul", "load", g.const("net0_load", w1[4:]))
        first = g.op("Add", first, g.op("Unsqueeze", from_load, g.const("axis_1", [1])))
    h = g.op("Relu", g.op("Add", first, g.const("net0_bias", b1)))
    exp = g.op(
        "Relu", g.op("Add", g.op("MatMul", h, g.const("net2", w2)), g.const("net2_bias", b2))
    )
    return g.op("ReduceMean", exp, axes=[1], keepdims=0), exp


def _head(g: Graph, w: dict[str, np.ndarray], arr: str, exp: str) -> str:
    """The pointer head: drop from arr [B, H], expert n from (arr, exp n) -> [B, 1 + N]."""
    d0, c0 = linear(w, "head.drop.0")
    d2, c2 = linear(w, "head.drop.2")
    drop = g.op(
        "Gemm",
        g.op("Relu", g.op("Gemm", arr, g.const("drop0", d0), g.const("drop0_bias", c0))),
        g.const("drop2", d2),
        g.const("drop2_bias", c2),
    )
    e0, b0 = linear(w, "head.expert.0")
    e2, b2 = linear(w, "head.expert.2")
    hidden = e0.shape[1]
    from_arr = g.op(
        "Unsqueeze",
        g.op("Gemm", arr, g.const("pair_arr", e0[:hidden]), g.const("pair_bias", b0)),
        g.const("axis_1", [1]),
    )
    pair = g.op(
        "Relu", g.op("Add", g.op("MatMul", exp, g.const("pair_exp", e0[hidden:])), from_arr)
    )
    per_expert = g.op(
        "Add", g.op("MatMul", pair, g.const("expert2", e2[:, 0])), g.const("expert2_bias", b2)
    )  # [B, N]
    return g.op("Concat", drop, per_expert, axis=1)


def export_actor(actor: QoSNet, path: Path, speed_prior: bool = False) -> None:
    """The actor as the gateway serves it: inputs `SERVED_INPUTS` (a batch of states
    whose experts are all candidates; Baseline RL's reads the experts only), output
    `logits` [B, 1 + N]. `speed_prior`: it was trained reading unmeasured experts at
    the mean measured speed, and the graph says so, so that it is served so."""
    w = weights(actor)
    g = Graph()
    if "encoder.net.0.weight" in w:
        arr, exp = _expert_features(g, w)
        reads_load = w["encoder.net.0.weight"].shape[1] > 4
        used: tuple[str, ...] = ("experts", "load") if reads_load else ("experts",)
    else:
        heads = next(m.heads for m in actor.modules() if isinstance(m, NodeAttention))
        layers = len({k.split(".")[2] for k in w if k.startswith("encoder.layers.")})
        arr, exp = _han(g, w, heads, layers)
        reads_load = "encoder.in_load.weight" in w
        used = tuple(k for k in SERVED_INPUTS if k != "load" or reads_load)
    shapes: dict[str, list[int | str]] = {
        "arrived": ["batch", F_REQ],
        "experts": ["batch", "experts", F_EXPERT],
        "queues": ["batch", "experts", 2, QUEUE_CAP, F_REQ],
        "queue_mask": ["batch", "experts", 2, QUEUE_CAP],
        "load": ["batch", 1],
    }
    g.save(
        path,
        "qos_actor",
        {k: (FLOAT, shapes[k]) for k in used},
        {"logits": (_head(g, w, arr, exp), FLOAT, ["batch", "actions"])},
        w,
        {TRAINED_WITH_SPEED_PRIOR: "true"} if speed_prior else None,
    )


def load_actor(path: Path, config: dict[str, object]) -> QoSNet:
    """An exported actor's weights back in PyTorch, for re-exporting it when the
    graph's form changes (training checkpoints are not committed). `config` is its
    training record's (`variant`, hidden, heads, layers, `arrival_rate`)."""
    values = parameters(path)
    actor = QoSNet(
        "experts" if config["variant"] == "baseline" else "han",
        int(str(config["hidden"])),
        int(str(config["heads"])),
        int(str(config["layers"])),
        load=bool(config.get("arrival_rate", False)),
    )
    missing = sorted(k for k in actor.state_dict() if k not in values)
    if missing:
        raise ValueError(f"{path}: no weights found for {missing}")
    try:
        actor.load_state_dict({k: torch.from_numpy(values[k].copy()) for k in actor.state_dict()})
    except RuntimeError as e:  # shapes that are not this config's
        raise ValueError(f"{path}: its weights do not fit the config: {e}") from None
    return actor


def parity(
    actor: QoSNet, path: Path, n_values: tuple[int, ...] = (3, 6, 12), batch: int = 64
) -> float:
    """The largest |PyTorch - onnxruntime| over random states whose experts are all
    candidates (as served), for several N."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    worst = 0.0
    actor.eval()
    for i, n in enumerate(n_values):
        inputs = example(batch, n, seed=i)
        inputs["expert_mask"][:] = 1.0
        with torch.no_grad():
            want = actor(*(torch.from_numpy(inputs[k]) for k in INPUTS)).numpy()
        got = session.run(["logits"], {k: v for k, v in inputs.items() if k in names})[0]
        worst = max(worst, float(np.abs(want - got).max()))
    return worst
