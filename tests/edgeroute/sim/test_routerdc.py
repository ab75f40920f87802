"""RouterDC's quality world: real graded scores per prompt and model, lengths that are
real where the data has them and never follow the splits."""

from __future__ import annotations

import statistics
from collections import Counter

from edgeroute.sim.edge import (
    MAX_TOKENS,
    load_tasks,
    routerdc_tasks,
)
from tests.support import DATA_DIR, needs_data
from workers.quality import ROUTERDC_MODELS, iter_samples

pytestmark = needs_data("RouterDC's scores in router_quality/")

JANET = "Janet’s ducks lay 16 eggs per day."  # GSM8K's first test question


def test_every_prompt_has_each_models_graded_score() -> None:
    tasks = routerdc_tasks(DATA_DIR)
    assert len(tasks) > 3000
    assert all(set(t.scores) == set(ROUTERDC_MODELS) for t in tasks)
    values = Counter(round(s, 1) for t in tasks for s in t.scores.values())
    # graded: the share of 10 sampled answers, not only right or wrong
    assert len(values) == 11 and sum(n for v, n in values.items() if 0 < v < 1) > 5000
    # the models differ on the same prompt (else routing by quality would be moot)
    assert statistics.fmean(len(set(t.scores.values())) > 1 for t in tasks) > 0.5


def test_a_gsm8k_prompt_takes_the_real_length_of_mixtrals_answer() -> None:
    janet = next(t for t in routerdc_tasks(DATA_DIR) if t.prompt.startswith(JANET))
    answer = next(
        s
        for s in iter_samples(DATA_DIR)
        if s.task == "gsm8k"
        and s.model == "mistralai/mixtral-8x7b-chat"
        and s.prompt.startswith(JANET)
    )
    assert set(janet.lengths.values()) == {min(MAX_TOKENS, answer.tokens)}


def test_the_splits_part_the_prompts_and_lengths_do_not_follow_them() -> None:
    parts = {
        s: load_tasks(DATA_DIR, split=s, quality="routerdc") for s in ("predictor", "agent", "eval")
    }
    prompts = {s: {t.prompt for t in ts} for s, ts in parts.items()}
    assert sum(map(len, prompts.values())) == len(routerdc_tasks(DATA_DIR))
    assert not prompts["agent"] & prompts["eval"] and not prompts["predictor"] & prompts["eval"]
    assert min(len(prompts["agent"]), len(prompts["eval"])) > 300
    # drawn lengths are seeded apart from the split hash: each split spans the range
    for tasks in parts.values():
        lengths = [next(iter(t.lengths.values())) for t in tasks]
        assert min(lengths) < 40 and max(lengths) >= MAX_TOKENS - 10
