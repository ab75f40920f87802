"""The QoS predictor as served: each model's bucketised score and output length for a
prompt (ONNX, one run per request), and `predicted_quality`, the scorer that routes by
it alone: the QoS papers' BERT-router baseline (BR), or quality beside load when
weighted with `load`.

It needs onnxruntime and the committed model files, not PyTorch.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from policies.onnx_session import one_thread_session
from policies.plugins import check_params
from policies.qos_text import gram_ids
from policies.types import BackendView, ClusterView, RequestInfo

log = logging.getLogger("edgeroute.predictor")

# The QoS models: RouterBench's world (the paper's fleet) here, other worlds in folders
# under it, each with its predictor, its runs and its model card.
MODEL_ROOT = Path(__file__).resolve().parent.parent / "models" / "qos"
# What `qos_drl` serves unless a spec names another folder: the agent trained for
# engines that batch and queue like vLLM, reading its own predictor's expected bucket
# (its MODEL_CARD.md). `predicted_quality`'s default is RouterDC's predictor read for
# its top bucket, the paper's BR.
DEFAULT_MODEL_DIR = MODEL_ROOT / "routerdc" / "expected-read"
DEFAULT_PREDICTOR_DIR = MODEL_ROOT / "routerdc"
BUCKETS = 10
MAX_TOKENS = 300.0
# Bucket midpoints: the values the features carry for a predicted bucket.
SCORE_MIDPOINTS = [(b + 0.5) / BUCKETS for b in range(BUCKETS)]
LENGTH_MIDPOINTS = [(b + 0.5) * MAX_TOKENS / BUCKETS for b in range(BUCKETS)]
_NO_WORDS = np.zeros(1, np.int64)


class ScorePredictor:
    """The bucketised score and length predictor (ONNX): one run per request, for every
    candidate at once. The gateway's `qos_drl` and `predicted_quality`, and the edge
    simulator, use this one."""

    def __init__(self, model_dir: Path = DEFAULT_PREDICTOR_DIR) -> None:
        self.folder = model_dir
        self._session = one_thread_session(model_dir / "predictor.onnx")
        self.models: list[str] = json.loads((model_dir / "predictor.json").read_text())["models"]
        self._experts: dict[tuple[str | None, frozenset[str]], int | None] = {}
        # per tuple of expert indices: the distinct rows to predict, where each index's
        # prediction is among them (-1: the mean of all), and whether any is -1
        self._rows: dict[tuple[int | None, ...], tuple[np.ndarray, list[int], bool]] = {}

    def index(self, names: Sequence[str]) -> int | None:
        """The predictor's index of the first of `names` it knows, by its full name or
        its name after the organisation ("Mistral-7B-v0.1" for
        "mistralai/Mistral-7B-v0.1"); None when it knows none. A mere tail is no
        match: a model served as "beta" is not "zephyr-7b-beta"."""
        for name in names:
            for i, m in enumerate(self.models):
                if name and (name == m or m.endswith("/" + name)):
                    return i
        return None

    def expert_of(self, b: BackendView) -> int | None:
        """The predictor's index of the model a backend serves: its expert name when it
        has one, else its served model names; None for a model it does not know, which
        is logged once. Kept per (expert, models): it is asked for every backend of
        every request."""
        key = (b.expert, b.models)
        if key in self._experts:
            return self._experts[key]
        names = [b.expert] if b.expert else sorted(b.models)
        found = self._experts[key] = self.index(names)
        if found is None:
            log.warning(
                "backend %s serves %s, which the QoS predictor does not know: it is "
                "predicted as the average of the models it knows",
                b.id,
                ", ".join(names),
            )
        return found

    @staticmethod
    def prompt_ids(prompt: str) -> np.ndarray:
        """The graph's `ids` input [1, T]: the prompt's grams, or for a prompt without
        words the padding id alone, which pools to zero."""
        ids = gram_ids(prompt)
        return (ids if len(ids) else _NO_WORDS)[None]

    def predict_for(
        self, prompt: str, backends: Sequence[BackendView]
    ) -> list[tuple[float, float]]:
        """`predict` on the models the backends serve."""
        return self.predict(prompt, [self.expert_of(b) for b in backends])

    def predict(self, prompt: str, experts: Sequence[int | None]) -> list[tuple[float, float]]:
        """(score, length) bucket midpoints of `prompt` on each expert index: one run
        for the request, which pools the prompt once, and one row per distinct expert
        (backends often share a model). An unknown model (None) gets the mean of every
        known model's prediction: a neutral guess, where any one model's would be a
        claim about a model it is not."""
        key = tuple(experts)
        rows = self._rows.get(key)
        if rows is None:
            if len(self._rows) >= 256:  # candidate sets come and go with health
                self._rows.clear()
            unique = list(dict.fromkeys(e for e in experts if e is not None))
            if None in experts:  # every model, for their mean
                unique += [i for i in range(len(self.models)) if i not in unique]
            where = [-1 if e is None else unique.index(e) for e in experts]
            rows = self._rows[key] = (np.array(unique, np.int64), where, None in experts)
        distinct, where, unknown = rows
        if not len(distinct):
            return []
        buckets = self._session.run(None, {"ids": self.prompt_ids(prompt), "expert": distinct})[0]
        per_row = [(SCORE_MIDPOINTS[a], LENGTH_MIDPOINTS[b]) for a, b in buckets.tolist()]
        if unknown:
            k = len(per_row)
            per_row.append((sum(p[0] for p in per_row) / k, sum(p[1] for p in per_row) / k))
        return [per_row[i] for i in where]


def predictor_dir(model_dir: Path) -> Path:
    """Where the predictor of the actor in `model_dir` is: beside it, else in the
    nearest folder above that has one (a run in `<world>/runs/<run>/` or
    `<world>/attempts/<set>/<run>/` trained with `<world>`'s), else RouterDC's
    (`DEFAULT_PREDICTOR_DIR`, read for its top bucket)."""
    model_dir = model_dir.resolve()
    for folder in (model_dir, *model_dir.parents):
        if (folder / "predictor.onnx").exists():
            return folder
    return DEFAULT_PREDICTOR_DIR


class PredictedQuality:
    """Each candidate's predicted score of the request on its model (the bucket
    midpoint, in [0, 1]). With `argmax` alone it sends every request to the model
    expected to answer it best, whatever the load (the QoS papers' BR baseline)."""

    name = "predicted_quality"

    def __init__(self, predictor: ScorePredictor) -> None:
        self.predictor = predictor

    def score(
        self, req: RequestInfo, view: ClusterView, candidates: Sequence[BackendView]
    ) -> list[float]:
        if not candidates:
            return []
        return [score for score, _ in self.predictor.predict_for(req.prompt, candidates)]


def predicted_quality(params: Mapping[str, Any]) -> PredictedQuality:
    """The scorer with the predictor in `params["model"]` (a folder, or one inside a
    world whose folder has it: see `predictor_dir`), else RouterDC's (`DEFAULT_PREDICTOR_DIR`)."""
    check_params(params, ("model",))
    model = params.get("model")
    folder = predictor_dir(Path(model)) if model else DEFAULT_PREDICTOR_DIR
    return PredictedQuality(load_predictor(folder))


def load_predictor(folder: Path) -> ScorePredictor:
    """The predictor in `folder`, one session per process while its files are unchanged."""
    folder = folder.resolve()
    return _predictor(folder, file_stamps(folder, ("predictor.onnx", "predictor.json")))


LOADED_CAP = 16  # folders kept loaded; a gateway serves a handful
Stamps = tuple[tuple[int, int], ...]


def file_stamps(folder: Path, names: Sequence[str]) -> Stamps:
    """Each file's (mtime, size): a cache key that changes when the files do."""
    out = []
    for name in names:
        try:
            st = (folder / name).stat()
        except OSError:
            out.append((-1, -1))  # loading then raises the policy's own error
        else:
            out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)


@functools.lru_cache(maxsize=LOADED_CAP)
def _predictor(folder: Path, files: Stamps) -> ScorePredictor:
    return ScorePredictor(folder)
