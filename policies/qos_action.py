"""The QoS-DRL actor's action drawn from its logits: one rule for training (the soft
actor-critic's exploration, `edgeroute.qos.sac`) and serving (`qos_drl` with
`sample=True`), so a served draw is the draw the agent learned by."""

from __future__ import annotations

import numpy as np


def drawn(logits: np.ndarray, u: np.ndarray) -> np.ndarray:
    """For each row of `logits` [..., A], the action whose share of the softmax holds
    `u` [..., 1] (uniform in [0, 1)): action a with probability softmax(logits)[a]."""
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    chosen: np.ndarray = np.minimum((p.cumsum(-1) < u).sum(-1), p.shape[-1] - 1)
    return chosen
