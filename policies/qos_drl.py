"""The QoS-aware deep-RL router, served: the trained actor and the predictor as one
ONNX graph.

For each arriving request the policy predicts, per candidate backend, the bucketised
score and output length (the predictor), builds the HAN state from the snapshot
(backend memory use and the gateway's in-flight requests on it, with their progress)
exactly as in training (`policies.qos_state.encode`), and takes the actor's most likely
action, all in one onnxruntime run of the graph `policies.qos_graph` joins at load.
Action 0, drop, becomes load shedding: a 503 with Retry-After; with `shed=False`
(engines that queue rather than refuse, and clients that would rather have a late
answer than none) the policy takes the most likely backend instead.

With `sample=True` the action is drawn from the actor's distribution, as the
soft actor-critic acted while it learned, rather than the most likely one; the draw
is the request's `entropy`'s, so the policy stays a function of its inputs. An actor
served by its argmax can herd every request onto the engine it currently ranks
first, a way of acting it never trained in (docs/research.md, "Served by its argmax").

With `speed_prior=True` a backend that has not finished a request yet is read as
running at the mean speed of those that have (`qos_state.with_speed_prior`), where
the features read its unmeasured speed as 0: with more engines than it trained on,
an actor can leave most of them unmeasured and herd onto one (docs/research.md,
"A prior for unmeasured engines"). An actor trained so (its graph's metadata says
`speed_prior`) is always served so.

An actor trained reading the load (`qos_state.load_feature`: the requests arriving
per second per candidate) is fed it from the request's `arrival_rate`, which the
gateway then measures (Need.ARRIVAL_RATE).

It needs onnxruntime, onnx (to join the graphs) and the committed model files, not
PyTorch.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from policies.filters import DEFAULT as DEFAULT_FILTERS
from policies.onnx_session import one_thread_session
from policies.pickers import Argmax
from policies.pipeline import Filter, Pipeline
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
from policies.qos_action import drawn
from policies.qos_graph import TRAINED_WITH_SPEED_PRIOR, joined
from policies.qos_state import (
    F_EXPERT,
    F_REQ,
    QUEUE_CAP,
    ExpertSnapshot,
    FeatureCache,
    expert_columns,
    load_feature,
    snapshot,
    with_speed_prior,
)
from policies.scorers import mix64
from policies.types import BackendView, ClusterView, Decision, RequestInfo

if TYPE_CHECKING:
    from onnxruntime import InferenceSession


class QoSDRL:
    name = "qos_drl"
    needs: frozenset[Need] = frozenset({Need.INFLIGHT_REQUESTS, Need.LATENCY_TARGETS})

    def __init__(
        self,
        model_dir: Path = DEFAULT_MODEL_DIR,
        latency_ms: float = 30.0,
        predictor: ScorePredictor | None = None,
        shed: bool = True,
        sample: bool = False,
        speed_prior: bool = False,
    ) -> None:
        """The actor in `model_dir`, with the predictor beside or above it
        (`predictor_dir`) unless one already loaded is given (one session per graph).
        `shed=False`: never drop, route to a backend. `sample`: draw the action from the
        actor's distribution rather than take the most likely one. `speed_prior`: read an
        unmeasured backend at the mean measured speed."""
        self.folder = model_dir
        self.predictor = predictor or ScorePredictor(predictor_dir(model_dir))
        self._session = one_thread_session(
            joined(model_dir / "actor.onnx", self.predictor.folder / "predictor.onnx")
        )
        meta = self._session.get_modelmeta().custom_metadata_map
        # an actor trained with the prior is served with it, whatever the route says
        self.trained_with_prior = meta.get(TRAINED_WITH_SPEED_PRIOR) == "true"
        self._load = "load" in {i.name for i in self._session.get_inputs()}
        if self._load:  # an actor trained reading the arrival rate
            self.needs = self.needs | {Need.ARRIVAL_RATE}
        self._unknown = len(self.predictor.models)  # the model index of the mean of all
        self._models: dict[tuple[int | None, ...], np.ndarray] = {}
        self._features: FeatureCache = {}
        self._rows: dict[tuple[str, ...], _Rows] = {}
        # the gateway's default filters, their verdicts kept per model and view epoch
        self._filters = Pipeline("qos_drl filters", DEFAULT_FILTERS, (), Argmax())
        self.shed, self.sample = shed, sample
        self.speed_prior = speed_prior or self.trained_with_prior
        self._target(latency_ms)
        self._last: tuple[RequestInfo, ClusterView] | None = None

    def _target(self, latency_ms: float) -> None:
        self.latency = latency_ms / 1000.0
        self._shed = Decision(
            None,
            reason="shed by the QoS policy: no backend can meet the latency target for it now",
            retry_after=1.0,
            token_target=self.latency,
        )

    def configured(
        self,
        latency_ms: float,
        shed: bool = True,
        sample: bool = False,
        speed_prior: bool = False,
    ) -> QoSDRL:
        """This policy for another latency target, shedding, way of acting and reading
        of unmeasured backends, sharing its ONNX sessions."""
        other = self._copy()
        other.shed, other.sample = shed, sample
        other.speed_prior = speed_prior or self.trained_with_prior
        other._target(latency_ms)
        return other

    def with_filters(self, filters: tuple[Filter, ...]) -> QoSDRL:
        """This policy choosing among the backends that pass `filters` (the route's),
        in place of the gateway's default filters; the actor scores those alone."""
        other = self._copy()
        other._filters = Pipeline("qos_drl filters", filters, (), Argmax())
        return other

    def _copy(self) -> QoSDRL:
        """A copy sharing the ONNX sessions, with nothing kept from this one's requests."""
        other = copy.copy(self)
        other._features = {}
        other._models = {}
        other._rows = {}
        other._last = None
        return other

    def decide(self, req: RequestInfo, view: ClusterView) -> Decision:
        scored = self._scored(req, view)
        if isinstance(scored, Decision):
            return scored
        candidates, preds, logits = scored
        best = self._best(logits, req.entropy)
        if best == 0:
            return self._shed
        score, length = preds[best - 1].tolist()
        return Decision(
            candidates[best - 1].id, predicted=(score, length), token_target=self.latency
        )

    def ranked(self, req: RequestInfo, view: ClusterView) -> tuple[Decision, ...]:
        """The actor's choice, then the other candidates in the order of its logits."""
        scored = self._scored(req, view)
        if isinstance(scored, Decision):
            return (scored,)
        candidates, preds, logits = scored
        best = self._best(logits, req.entropy)
        if best == 0:
            return (self._shed,)
        order = np.argsort(-logits[1 : len(candidates) + 1], kind="stable").tolist()
        order.remove(best - 1)
        order.insert(0, best - 1)
        predicted = preds.tolist()
        return tuple(
            Decision(candidates[i].id, predicted=tuple(predicted[i]), token_target=self.latency)
            for i in order
        )

    def warm(self) -> bool:
        """The last decision again, its result discarded (`policies.Warmable`): the
        same features, predictions and actor run, so its caches gain no new entry."""
        if self._last is None:
            return False
        self._scored(*self._last)
        return True

    def _best(self, logits: np.ndarray, entropy: int = 0) -> int:
        """The action taken (0: drop): the most likely one, or with `sample` one drawn
        by `entropy` from the softmax of the logits as in training (`qos_action`); among
        the backends only when the policy does not shed."""
        first = 0 if self.shed else 1
        logits = logits[first:]
        if not self.sample:
            return first + int(np.argmax(logits))
        u = np.array((mix64(entropy) / 2.0**64,))
        return first + int(drawn(logits.astype(np.float64), u))

    def _scored(
        self, req: RequestInfo, view: ClusterView
    ) -> tuple[Sequence[BackendView], np.ndarray, np.ndarray] | Decision:
        """The candidates, their predictions [N, 2] and the actor's logits over {drop,
        each}; or the rejection naming the filter that left no candidate."""
        candidates = self._filters.candidates(req, view)
        if isinstance(candidates, Decision):
            return candidates
        self._last = (req, view)
        stale_after, features = view.stale_after, self._features
        rows = self._rows_of(candidates)
        experts: Sequence[ExpertSnapshot] = [snapshot(b, stale_after, features) for b in candidates]
        if self.speed_prior:
            experts = with_speed_prior(experts)
        rows.update(experts, self.latency)
        rows.scalars[0] = (req.prompt_tokens, req.now, self.latency)
        if self._load:
            rows.load[0, 0] = load_feature(req.arrival_rate, len(candidates))
        ids, models = self.predictor.prompt_ids(req.prompt), self._model_rows(candidates)
        logits, preds = rows.run(self._session, ids, models)
        return candidates, preds, logits[0]

    def _rows_of(self, candidates: Sequence[BackendView]) -> _Rows:
        key = tuple(b.id for b in candidates)
        rows = self._rows.get(key)
        if rows is None:
            if len(self._rows) >= 256:
                self._rows.clear()
            rows = self._rows[key] = _Rows(self._session, len(key))
        return rows

    def _model_rows(self, candidates: Sequence[BackendView]) -> np.ndarray:
        """Each candidate's model index in the predictor, the unknown ones' the index
        of the mean of all; kept per tuple (candidate sets come and go with health)."""
        key = tuple(map(self.predictor.expert_of, candidates))
        rows = self._models.get(key)
        if rows is None:
            if len(self._models) >= 256:
                self._models.clear()
            rows = self._models[key] = np.array(
                [self._unknown if e is None else e for e in key], np.int64
            )
        return rows


class _Rows:
    """The graph's inputs and outputs for one set of candidates, bound to the session
    once: each expert's own columns (`expert_columns`, zeros where the graph adds the
    predictions), for an actor that reads the queues its packed rows, the scalars, the
    load, the logits and the predictions. Between requests most backends keep their
    snapshot (the gateway rebuilds the view of the one it dispatched to), so only the
    rows of those whose snapshot changed are written again, in place; a run then binds
    only the prompt's ids and the candidates' models. Bound buffers spare each run the
    wrapping of its inputs and the allocation of its outputs: about a tenth of a
    decision on the request path, where the graph's own nodes are the rest
    (docs/performance.md, "Buffers bound once")."""

    __slots__ = (
        "binding",
        "ids",
        "load",
        "logits",
        "own",
        "packed",
        "preds",
        "scalars",
        "snapshots",
    )

    def __init__(self, session: InferenceSession, n: int) -> None:
        inputs = {i.name for i in session.get_inputs()}
        self.snapshots: list[ExpertSnapshot | None] = [None] * n
        self.own = np.zeros((1, n, F_EXPERT), np.float32)
        self.packed = np.zeros((1, n if "packed" in inputs else 0, 2, QUEUE_CAP, F_REQ + 3))
        self.scalars = np.zeros((1, 3))
        self.load = np.zeros((1, 1), np.float32)
        self.logits = np.zeros((1, n + 1), np.float32)
        self.preds = np.zeros((n, 2))
        self.binding = session.io_binding()
        buffers = {
            "experts_own": self.own,
            "packed": self.packed,
            "scalars": self.scalars,
            "load": self.load,
        }
        for name in inputs & buffers.keys():
            self.binding.bind_cpu_input(name, buffers[name])
        for name, out in (("logits", self.logits), ("preds", self.preds)):
            self.binding.bind_output(name, "cpu", 0, out.dtype, out.shape, out.ctypes.data)
        self.ids = np.zeros((1, 0), np.int64)

    def update(self, experts: Sequence[ExpertSnapshot], latency: float) -> None:
        queues = self.packed.shape[1] > 0
        for i, e in enumerate(experts):
            if e is not self.snapshots[i]:
                self.own[0, i] = expert_columns(e, latency)
                if queues:
                    self.packed[0, i] = e.packed
                self.snapshots[i] = e

    def run(
        self, session: InferenceSession, ids: np.ndarray, models: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The graph (`session`, the one this was bound to) on the bound buffers: the
        logits [1, N + 1] and predictions [N, 2], this object's own arrays, overwritten
        by its next run."""
        self.ids = ids
        self.binding.bind_cpu_input("ids", ids)
        self.binding.bind_cpu_input("model", models)
        session.run_with_iobinding(self.binding)
        return self.logits, self.preds


def load(
    model_dir: Path = DEFAULT_MODEL_DIR,
    latency_ms: float = 30.0,
    shed: bool = True,
    sample: bool = False,
    speed_prior: bool = False,
) -> QoSDRL:
    """The policy in `model_dir`, sharing the ONNX sessions of any earlier load of the
    same files in this process: routes that differ only in their target, and
    runs that share a predictor, load each graph once. Files changed since (a new
    mtime or size) are loaded anew."""
    folder = model_dir.resolve()
    predictor = load_predictor(predictor_dir(folder))
    shared = _loaded(folder, file_stamps(folder, ("actor.onnx",)), predictor)
    return shared.configured(latency_ms, shed, sample, speed_prior)


@functools.lru_cache(maxsize=LOADED_CAP)
def _loaded(model_dir: Path, actor: Stamps, predictor: ScorePredictor) -> QoSDRL:
    return QoSDRL(model_dir, predictor=predictor)
