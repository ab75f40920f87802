"""The QoS-aware deep-RL router, served: the trained actor as one ONNX graph.

For each arriving request the policy predicts, per candidate backend, the bucketised
score and output length (the predictor, also ONNX), builds the HAN state from the
snapshot (backend memory use and the gateway's in-flight requests on it, with their
progress) exactly as in training (`policies.qos_state.encode`), and takes the actor's
most likely action. Action 0, drop, becomes load shedding: a 503 with Retry-After;
with `shed=False` (engines that queue rather than refuse, and clients that would rather
have a late answer than none) the policy takes the most likely backend instead.

It needs onnxruntime and the committed model files, not PyTorch.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from policies.filters import Healthy, Role, ServesModel
from policies.pickers import Argmax
from policies.pipeline import Pipeline
from policies.plugins import Need
from policies.predictor import (
    DEFAULT_MODEL_DIR,
    LOADED_CAP,
    ScorePredictor,
    Stamps,
    file_stamps,
    load_predictor,
    predictor_dir,
)
from policies.qos_state import INPUTS, FeatureCache, encode, snapshot
from policies.types import BackendView, ClusterView, Decision, RequestInfo


class QoSDRL:
    name = "qos_drl"
    needs = frozenset({Need.INFLIGHT_REQUESTS, Need.LATENCY_TARGETS})

    def __init__(
        self,
        model_dir: Path = DEFAULT_MODEL_DIR,
        latency_ms: float = 30.0,
        predictor: ScorePredictor | None = None,
        shed: bool = True,
    ) -> None:
        """The actor in `model_dir`, with the predictor beside or above it
        (`predictor_dir`) unless one already loaded is given (one session per graph).
        `shed=False`: never drop, route to the actor's most likely backend."""
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        providers = ["CPUExecutionProvider"]
        self._actor = ort.InferenceSession(str(model_dir / "actor.onnx"), opts, providers=providers)
        self.predictor = predictor or ScorePredictor(predictor_dir(model_dir))
        self._features: FeatureCache = {}
        names = {i.name for i in self._actor.get_inputs()}
        self._inputs = [k for k in INPUTS if k in names]
        # the gateway's default filters, their verdicts kept per model and view epoch
        self._filters = Pipeline(
            "qos_drl filters", (Healthy(), ServesModel(), Role()), (), Argmax()
        )
        self.shed = shed
        self._target(latency_ms)

    def _target(self, latency_ms: float) -> None:
        self.latency = latency_ms / 1000.0
        self._shed = Decision(
            None,
            reason="shed by the QoS policy: no backend can meet the latency target for it now",
            retry_after=1.0,
            token_target=self.latency,
        )

    def configured(self, latency_ms: float, shed: bool = True) -> QoSDRL:
        """This policy for another latency target and shedding, sharing its ONNX
        sessions."""
        other = copy.copy(self)
        other._features = {}
        other.shed = shed
        other._target(latency_ms)
        return other

    def decide(self, req: RequestInfo, view: ClusterView) -> Decision:
        scored = self._scored(req, view)
        if isinstance(scored, Decision):
            return scored
        candidates, preds, logits = scored
        best = self._best(logits)
        if best == 0:
            return self._shed
        return Decision(
            candidates[best - 1].id, predicted=preds[best - 1], token_target=self.latency
        )

    def ranked(self, req: RequestInfo, view: ClusterView) -> tuple[Decision, ...]:
        """The actor's choice, then the other candidates in the order of its logits."""
        scored = self._scored(req, view)
        if isinstance(scored, Decision):
            return (scored,)
        candidates, preds, logits = scored
        if self._best(logits) == 0:
            return (self._shed,)
        order = np.argsort(-logits[1 : len(candidates) + 1], kind="stable")
        return tuple(
            Decision(candidates[i].id, predicted=preds[i], token_target=self.latency)
            for i in order.tolist()
        )

    def _best(self, logits: np.ndarray) -> int:
        """The action taken: the most likely one, or the most likely backend."""
        return int(np.argmax(logits)) if self.shed else 1 + int(np.argmax(logits[1:]))

    def _scored(
        self, req: RequestInfo, view: ClusterView
    ) -> tuple[Sequence[BackendView], list[tuple[float, float]], np.ndarray] | Decision:
        """The candidates, their predictions and the actor's logits over {drop, each};
        or the rejection naming the filter that left no candidate."""
        candidates = self._filters.candidates(req, view)
        if isinstance(candidates, Decision):
            return candidates
        preds = self.predictor.predict_for(req.prompt, candidates)
        obs = encode(
            req.prompt_tokens,
            preds,
            [snapshot(b, view.stale_after, self._features) for b in candidates],
            self.latency,
            req.now,
        )
        feeds: dict[str, Any] = {k: obs[k][None] for k in self._inputs}
        logits: np.ndarray = self._actor.run(["logits"], feeds)[0][0]
        return candidates, preds, logits


def load(
    model_dir: Path = DEFAULT_MODEL_DIR, latency_ms: float = 30.0, shed: bool = True
) -> QoSDRL:
    """The policy in `model_dir`, sharing the ONNX sessions of any earlier load of the
    same files in this process: routes that differ only in their target, and
    runs that share a predictor, load each graph once. Files changed since (a new
    mtime or size) are loaded anew."""
    folder = model_dir.resolve()
    predictor = load_predictor(predictor_dir(folder))
    shared = _loaded(folder, file_stamps(folder, ("actor.onnx",)), predictor)
    return shared.configured(latency_ms, shed)


@functools.lru_cache(maxsize=LOADED_CAP)
def _loaded(model_dir: Path, actor: Stamps, predictor: ScorePredictor) -> QoSDRL:
    return QoSDRL(model_dir, predictor=predictor)
