"""The QoS-aware deep-RL router, served: the trained actor as one ONNX graph.

For each arriving request the policy predicts, per candidate backend, the bucketised
score and output length (the predictor, also ONNX), builds the HAN state from the
snapshot (backend memory use and the gateway's in-flight requests on it, with their
progress) exactly as in training (`policies.qos_state.encode`), and takes the actor's
most likely action. Action 0, drop, becomes load shedding: a 503 with Retry-After.

It needs onnxruntime and the committed model files, not PyTorch.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from policies.filters import Healthy, Role, ServesModel
from policies.plugins import Need
from policies.qos_state import INPUTS, FeatureCache, encode, snapshot
from policies.qos_text import gram_ids
from policies.types import BackendView, ClusterView, Decision, RequestInfo

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "qos"
BUCKETS = 10
MAX_TOKENS = 300.0
# Bucket midpoints: the values the features carry for a predicted bucket.
_SCORE_MID = [(b + 0.5) / BUCKETS for b in range(BUCKETS)]
_LENGTH_MID = [(b + 0.5) * MAX_TOKENS / BUCKETS for b in range(BUCKETS)]
NO_BACKEND = Decision(None, reason="no backend passed the filters")


class ScorePredictor:
    """The bucketised score and length predictor (ONNX): one run per request, for every
    candidate at once. The gateway's `qos_drl` and the edge simulator use this one."""

    def __init__(self, model_dir: Path = DEFAULT_MODEL_DIR) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(model_dir / "predictor.onnx"), opts, providers=["CPUExecutionProvider"]
        )
        self.models: list[str] = json.loads((model_dir / "predictor.json").read_text())["models"]
        self._index: dict[tuple[str, ...], int] = {}
        self._rows: dict[tuple[int, ...], tuple[np.ndarray, list[int]]] = {}

    def index(self, names: Sequence[str]) -> int:
        """The predictor's index of a model (by name or suffix); 0 when unknown. Kept
        per name list: it is asked for every backend of every request."""
        key = tuple(names)
        found = self._index.get(key)
        if found is None:
            found = self._index[key] = self._match(key)
        return found

    def _match(self, names: Sequence[str]) -> int:
        for name in names:
            for i, m in enumerate(self.models):
                if name and (name == m or m.endswith("/" + name) or m.endswith(name)):
                    return i
        return 0

    def predict(self, prompt: str, experts: Sequence[int]) -> list[tuple[float, float]]:
        """(score, length) bucket midpoints of `prompt` on each expert index: one run
        for the request, which pools the prompt once, and one row per distinct expert
        (backends often share a model)."""
        key = tuple(experts)
        rows = self._rows.get(key)
        if rows is None:
            if len(self._rows) >= 256:  # candidate sets come and go with health
                self._rows.clear()
            unique = list(dict.fromkeys(experts))
            where = [unique.index(e) for e in experts]
            rows = self._rows[key] = (np.array(unique, np.int64), where)
        ids = gram_ids(prompt)
        if not len(ids):
            ids = np.zeros(1, np.int64)  # no words: the padding id, which pools to zero
        score, length = self._session.run(None, {"ids": ids[None], "expert": rows[0]})
        per_row = [
            (_SCORE_MID[a], _LENGTH_MID[b])
            for a, b in zip(score.argmax(-1).tolist(), length.argmax(-1).tolist(), strict=True)
        ]
        return [per_row[i] for i in rows[1]]


def predictor_dir(model_dir: Path) -> Path:
    """Where the predictor of the actor in `model_dir` is: beside it, else in the
    nearest folder above that has one (a run in `<world>/runs/<run>/` or
    `<world>/attempts/<set>/<run>/` trained with `<world>`'s), else the one the
    gateway ships."""
    model_dir = model_dir.resolve()
    for folder in (model_dir, *model_dir.parents):
        if (folder / "predictor.onnx").exists():
            return folder
    return DEFAULT_MODEL_DIR


class QoSDRL:
    name = "qos_drl"
    needs = frozenset({Need.INFLIGHT_REQUESTS, Need.LATENCY_TARGETS})

    def __init__(
        self,
        model_dir: Path = DEFAULT_MODEL_DIR,
        latency_ms: float = 30.0,
        predictor: ScorePredictor | None = None,
    ) -> None:
        """The actor in `model_dir`, with the predictor beside or above it
        (`predictor_dir`) unless one already loaded is given (one session per graph)."""
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        providers = ["CPUExecutionProvider"]
        self._actor = ort.InferenceSession(str(model_dir / "actor.onnx"), opts, providers=providers)
        self.predictor = predictor or ScorePredictor(predictor_dir(model_dir))
        self._features: FeatureCache = {}
        names = {i.name for i in self._actor.get_inputs()}
        self._inputs = [k for k in INPUTS if k in names]
        self._experts: dict[tuple[str | None, frozenset[str]], int] = {}
        self._filters = (Healthy(), ServesModel(), Role())
        self._target(latency_ms)

    def _target(self, latency_ms: float) -> None:
        self.latency = latency_ms / 1000.0
        self._shed = Decision(
            None,
            reason="shed by the QoS policy: no backend can meet the latency target for it now",
            retry_after=1.0,
            token_target=self.latency,
        )

    def with_latency(self, latency_ms: float) -> QoSDRL:
        """This policy for another latency target, sharing its ONNX sessions."""
        other = copy.copy(self)
        other._features = {}
        other._target(latency_ms)
        return other

    def predict(self, prompt: str, backends: Sequence[BackendView]) -> list[tuple[float, float]]:
        return self.predictor.predict(prompt, [self._expert(b) for b in backends])

    def _expert(self, b: BackendView) -> int:
        key = (b.expert, b.models)
        found = self._experts.get(key)
        if found is None:
            names = [b.expert] if b.expert else sorted(b.models)
            found = self._experts[key] = self.predictor.index(names)
        return found

    def decide(self, req: RequestInfo, view: ClusterView) -> Decision:
        scored = self._scored(req, view)
        if scored is None:
            return NO_BACKEND
        candidates, preds, logits = scored
        best = int(np.argmax(logits))
        if best == 0:
            return self._shed
        return Decision(
            candidates[best - 1].id, predicted=preds[best - 1], token_target=self.latency
        )

    def ranked(self, req: RequestInfo, view: ClusterView) -> tuple[Decision, ...]:
        """The actor's choice, then the other candidates in the order of its logits."""
        scored = self._scored(req, view)
        if scored is None:
            return (NO_BACKEND,)
        candidates, preds, logits = scored
        if int(np.argmax(logits)) == 0:
            return (self._shed,)
        order = np.argsort(-logits[1 : len(candidates) + 1], kind="stable")
        return tuple(
            Decision(candidates[i].id, predicted=preds[i], token_target=self.latency)
            for i in order.tolist()
        )

    def _scored(
        self, req: RequestInfo, view: ClusterView
    ) -> tuple[list[BackendView], list[tuple[float, float]], np.ndarray] | None:
        """The candidates, their predictions and the actor's logits over {drop, each}."""
        candidates = [b for b in view.backends if all(f.keep(req, view, b) for f in self._filters)]
        if not candidates:
            return None
        preds = self.predict(req.prompt, candidates)
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


def load(model_dir: Path = DEFAULT_MODEL_DIR, latency_ms: float = 30.0) -> QoSDRL:
    """The policy in `model_dir`, sharing the ONNX sessions of any earlier load of the
    same files in this process: routes that differ only in their target, and
    runs that share a predictor, load each graph once. Files changed since (a new
    mtime or size) are loaded anew."""
    folder = model_dir.resolve()
    predictor = load_predictor(predictor_dir(folder))
    shared = _loaded(folder, _stamps(folder, ("actor.onnx",)), predictor)
    return shared.with_latency(latency_ms)


def load_predictor(folder: Path) -> ScorePredictor:
    """The predictor in `folder`, one session per process while its files are unchanged."""
    folder = folder.resolve()
    return _predictor(folder, _stamps(folder, ("predictor.onnx", "predictor.json")))


_LOADED_CAP = 16  # folders kept loaded; a gateway serves a handful
_Stamps = tuple[tuple[int, int], ...]


def _stamps(folder: Path, names: Sequence[str]) -> _Stamps:
    out = []
    for name in names:
        try:
            st = (folder / name).stat()
        except OSError:
            out.append((-1, -1))  # loading then raises the policy's own error
        else:
            out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)


@functools.lru_cache(maxsize=_LOADED_CAP)
def _loaded(model_dir: Path, actor: _Stamps, predictor: ScorePredictor) -> QoSDRL:
    return QoSDRL(model_dir, predictor=predictor)


@functools.lru_cache(maxsize=_LOADED_CAP)
def _predictor(folder: Path, files: _Stamps) -> ScorePredictor:
    return ScorePredictor(folder)
