"""What each expert model answers: response length and quality, from real data.

Two sources, both derived from `shared/data/router_quality/` (RouterBench 0-shot
as redistributed by RouterDC, RouteLLM's GSM8K responses, and RouterDC's own scores of
seven open models, `iter_routerdc_samples`):

- `PromptIndex`: prompt text -> each model's real response length and score.
  Built at start-up from the data folder when it is there; a request whose last
  user message is a data-set prompt gets that model's real answer length and score.
- `ExpertDistributions`: per model and task, quantiles of score and response
  length, fitted from the same files and committed as `workers/data/expert_profiles.json`
  so the workers run without the data folder. Other prompts draw from these.

Lengths are response characters / 4 (the files carry text, not tokens).
"""

from __future__ import annotations

import ast
import csv
import gzip
import hashlib
import json
import os
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from policies.text import estimate_tokens

DATA_DIR_ENV = "EDGEROUTE_DATA_DIR"
PROFILES_FILE = Path(__file__).parent / "data" / "expert_profiles.json"
QUANTILES = 21
ROUTERBENCH_FILES = tuple(
    f"routerbench_0shot_{task}_{split}.csv.gz"
    for task in ("arc_challenge", "mbpp", "winograde")
    for split in ("train", "test")
)
# RouterDC's seven open 7-8B models, scored per prompt (`iter_routerdc_samples`).
ROUTERDC_MODELS = (
    "mistralai/Mistral-7B-v0.1",
    "meta-math/MetaMath-Mistral-7B",
    "itpossible/Chinese-Mistral-7B-v0.1",
    "HuggingFaceH4/zephyr-7b-beta",
    "cognitivecomputations/dolphin-2.6-mistral-7b",
    "meta-llama/Meta-Llama-3-8B",
    "cognitivecomputations/dolphin-2.9-llama3-8b",
)
ROUTERDC_FILE = "routerdc_7model_scores.csv.gz"
# RouterDC's free-form sources, and the open model whose real answers stand in for
# their lengths (RouterDC has scores only): RouteLLM's Mixtral on GSM8K and
# RouterBench's Mistral-7B on MBPP (code; MATH's worked answers as GSM8K's).
ROUTERDC_LENGTHS = {
    "gsm8k-test": ("gsm8k", "mistralai/mixtral-8x7b-chat"),
    "gsm8k-train": ("gsm8k", "mistralai/mixtral-8x7b-chat"),
    "MATH_prealgebra": ("gsm8k", "mistralai/mixtral-8x7b-chat"),
    "mbpp": ("mbpp", "mistralai/mistral-7b-chat"),
    "humaneval_test": ("mbpp", "mistralai/mistral-7b-chat"),
    "humaneval_train": ("mbpp", "mistralai/mistral-7b-chat"),
    "javascript": ("mbpp", "mistralai/mistral-7b-chat"),
}
# RouteLLM's Mixtral-8x7B-Instruct is the model RouterBench calls mixtral-8x7b-chat.
ROUTELLM_MODELS = {
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/mixtral-8x7b-chat",
    "gpt-4-1106-preview": "gpt-4-1106-preview",
}


def default_data_dir() -> Path:
    """`EDGEROUTE_DATA_DIR`, else `../shared/data` beside the checkout."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def prompt_key(text: str) -> str:
    """Whitespace-insensitive key of a prompt."""
    return hashlib.sha1(" ".join(text.split()).encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class Sample:
    """One model's real answer to one prompt."""

    prompt: str
    task: str
    model: str
    score: float
    tokens: int


def literal_text(value: str) -> str:
    """RouterBench stores prompts and responses as Python list literals."""
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value
    if isinstance(parsed, list):
        return "\n".join(str(p) for p in parsed)
    return str(parsed)


def iter_samples(data_dir: Path) -> Iterator[Sample]:
    """Every (prompt, model) answer with a length and a score in the quality data."""
    csv.field_size_limit(1 << 30)
    base = data_dir / "router_quality"
    for name in ROUTERBENCH_FILES:
        path = base / name
        if not path.exists():
            continue
        with gzip.open(path, "rt", newline="") as fh:
            for row in csv.DictReader(fh):
                prompt = literal_text(row["prompt"])
                for col, response in row.items():
                    if not col.endswith("|model_response"):
                        continue
                    model = col.split("|", 1)[0]
                    score = row.get(model, "")
                    if score in ("", None):
                        continue
                    yield Sample(
                        prompt,
                        row["eval_name"],
                        model,
                        float(score),
                        estimate_tokens(literal_text(response)),
                    )
    path = base / "routellm_gsm8k_responses.csv.gz"
    if path.exists():
        with gzip.open(path, "rt", newline="") as fh:
            for row in csv.DictReader(fh):
                for source, model in ROUTELLM_MODELS.items():
                    yield Sample(
                        row["prompt"],
                        "gsm8k",
                        model,
                        1.0 if row[source] == "True" else 0.0,
                        estimate_tokens(row[f"{source}_response"]),
                    )


def _lookup_key(text: str) -> str:
    return " ".join(text.split()).lower()


def _first_line(text: str) -> str:
    """MBPP as RouterDC wraps it (a docstring holding the task, then its asserts): the
    task's line, as RouterBench gives it."""
    lines = [x for x in text.strip().strip('"').strip().splitlines() if x.strip()]
    return _lookup_key(lines[0]) if lines else ""


def iter_routerdc_samples(
    data_dir: Path, answers: Iterable[Sample] | None = None
) -> Iterator[Sample]:
    """RouterDC's free-form prompts, each with every one of its seven models' real score
    (the share of 10 sampled answers that were right; MATH 0/1). RouterDC has no
    answers, so a prompt's length is the same for every model: the real length of the
    stand-in model's answer to it where `iter_samples` has one (all of GSM8K's test
    set, a quarter of MBPP), else a draw from that model's lengths on that kind of
    task, fixed by the prompt. `answers`: `iter_samples(data_dir)` if already read."""
    path = data_dir / "router_quality" / ROUTERDC_FILE
    if not path.exists():
        return
    real: dict[tuple[str, str], dict[str, int]] = {}
    pools: dict[tuple[str, str], list[int]] = {}
    wanted = set(ROUTERDC_LENGTHS.values())
    for s in iter_samples(data_dir) if answers is None else answers:
        if (s.task, s.model) in wanted:
            real.setdefault((s.task, s.model), {})[_lookup_key(s.prompt)] = s.tokens
            pools.setdefault((s.task, s.model), []).append(s.tokens)
    for pool in pools.values():
        pool.sort()
    seen: set[str] = set()
    with gzip.open(path, "rt", newline="") as fh:
        for row in csv.DictReader(fh):
            stand_in = ROUTERDC_LENGTHS.get(row["source_file"])
            prompt = row["question"]
            if stand_in is None or prompt in seen:
                continue
            seen.add(prompt)
            known = real.get(stand_in, {})
            tokens = known.get(_lookup_key(prompt)) or known.get(_first_line(prompt))
            if tokens is None:
                pool = pools[stand_in]
                tokens = pool[
                    int(hashlib.sha1(b"length " + prompt.encode()).hexdigest()[:8], 16) % len(pool)
                ]
            for model in ROUTERDC_MODELS:
                yield Sample(prompt, row["source_file"], model, float(row[model]), tokens)


def all_samples(data_dir: Path) -> list[Sample]:
    """`iter_samples` and `iter_routerdc_samples`, the data read once."""
    first = list(iter_samples(data_dir))
    return first + list(iter_routerdc_samples(data_dir, first))


def _quantiles(values: list[float]) -> list[float]:
    values = sorted(values)
    n = len(values)
    return [values[min(n - 1, round(q * (n - 1) / (QUANTILES - 1)))] for q in range(QUANTILES)]


def fit_distributions(data_dir: Path) -> dict[str, object]:
    """Per model and task quantiles of score and length; the committed artefact."""
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    lengths: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in all_samples(data_dir):
        for task in (s.task, "general"):
            scores[s.model][task].append(s.score)
            lengths[s.model][task].append(s.tokens)
    models = {
        model: {
            task: {
                "n": len(scores[model][task]),
                "score_mean": round(sum(scores[model][task]) / len(scores[model][task]), 4),
                "score_q": _quantiles(scores[model][task]),
                "tokens_q": _quantiles(lengths[model][task]),
            }
            for task in sorted(scores[model])
        }
        for model in sorted(scores)
    }
    return {
        "source": "shared/data/router_quality: RouterBench 0-shot (arc-challenge, mbpp, "
        "winogrande; via RouterDC), RouteLLM gsm8k_responses, and RouterDC's scores of "
        "seven open models (lengths from a stand-in model); tokens = chars / 4",
        "command": "edgeroute worker fit-profiles",
        "models": models,
    }


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the emulated model will answer: its length, score, and where they came from."""

    tokens: int
    score: float
    task: str
    source: str  # "dataset" or "distribution"


class ExpertDistributions:
    def __init__(self, models: dict[str, dict[str, dict[str, object]]]) -> None:
        self._models = models

    @classmethod
    def load(cls, path: Path = PROFILES_FILE) -> ExpertDistributions:
        return cls(json.loads(path.read_text())["models"])

    def models(self) -> list[str]:
        return sorted(self._models)

    def tasks(self, model: str) -> list[str]:
        return sorted(self._models.get(model, {}))

    def draw(self, model: str, task: str | None, seed: int) -> Outcome:
        per_task = self._models[model]
        task = task if task in per_task else "general"
        dist = per_task[task]
        rng = random.Random(seed)
        score_q: list[float] = dist["score_q"]  # type: ignore[assignment]
        tokens_q: list[float] = dist["tokens_q"]  # type: ignore[assignment]
        score = score_q[rng.randrange(QUANTILES)]
        tokens = int(tokens_q[rng.randrange(QUANTILES)])
        return Outcome(max(1, tokens), score, task, "distribution")


class PromptIndex:
    """Data-set prompt -> each model's real (score, length)."""

    def __init__(self, samples: dict[str, dict[str, Sample]]) -> None:
        self._samples = samples

    @classmethod
    def build(cls, samples: Iterable[Sample]) -> PromptIndex:
        index: dict[str, dict[str, Sample]] = defaultdict(dict)
        for s in samples:
            index[prompt_key(s.prompt)].setdefault(s.model, s)
        return cls(dict(index))

    def __len__(self) -> int:
        return len(self._samples)

    def lookup(self, prompt: str, model: str) -> Sample | None:
        return self._samples.get(prompt_key(prompt), {}).get(model)


@lru_cache(maxsize=4)
def prompt_index(data_dir: Path, routerdc: bool = False) -> PromptIndex:
    """One index per data folder and source per process, shared by every worker in it:
    RouterDC's models answer only in `iter_routerdc_samples`, the others only in
    `iter_samples`, so a worker reads just the source that holds its model."""
    if not data_dir.exists():
        return PromptIndex({})
    return PromptIndex.build(
        iter_routerdc_samples(data_dir) if routerdc else iter_samples(data_dir)
    )


@lru_cache(maxsize=1)
def expert_distributions() -> ExpertDistributions:
    return ExpertDistributions.load()


class GroundTruth:
    """Decides each answer of one model: real when the prompt is in the data, else drawn."""

    def __init__(self, model: str, data_dir: Path | None) -> None:
        self.model = model
        self._index = (
            prompt_index(data_dir, model in ROUTERDC_MODELS)
            if data_dir is not None
            else PromptIndex({})
        )
        self._dist = expert_distributions()
        if model not in self._dist.models():
            raise ValueError(f"no quality data for model {model!r}")

    def outcome(self, prompt: str, task: str | None, seed: int) -> Outcome:
        sample = self._index.lookup(prompt, self.model)
        if sample is not None:
            return Outcome(sample.tokens, sample.score, sample.task, "dataset")
        return self._dist.draw(self.model, task, seed)
