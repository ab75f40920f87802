"""`best_predicted` (the QoS papers' BR baseline) served by the gateway: real workers
serving three of RouterBench's models, RouterBench's predictor named in the spec, the
official SDK."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai

from policies.predictor import MODEL_ROOT, load_predictor
from policies.types import BackendView

Start = Callable[..., tuple[str, Any]]
MODEL = "edge"
PROFILES = ("mistral-7b-chat", "mixtral-8x7b-chat", "llama-2-70b-chat")
PROMPT = "Write a function to sort a list of tuples by their second element."


def test_every_answer_comes_from_a_model_predicted_to_answer_best(
    start_worker: Start, start_gateway: Start
) -> None:
    backends = []
    for profile in PROFILES:
        url, _ = start_worker(profile=profile, served_model_names=[profile, MODEL], speedup=50.0)
        backends.append({"url": url, "id": profile})
    spec = {
        "policy": "best_predicted",
        "scorers": [{"type": "predicted_quality", "params": {"model": str(MODEL_ROOT)}}],
    }
    url, _ = start_gateway(backends, routing={"default": spec})
    predictor = load_predictor(MODEL_ROOT)
    views = [BackendView(id=p, models=frozenset({p, MODEL})) for p in PROFILES]
    scores = [s for s, _ in predictor.predict_for(PROMPT, views)]
    best = {p for p, s in zip(PROFILES, scores, strict=True) if s == max(scores)}
    assert best != set(PROFILES)  # the prompt tells the models apart

    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    served = set()
    for _ in range(6):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=4
        )
        assert raw.parse().choices[0].message.content
        served.add(raw.headers["x-edgeroute-backend"])
    with client.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=4,
        stream=True,
    ) as stream:
        served.add(stream.headers["x-edgeroute-backend"])
        assert any(line for line in stream.iter_lines())
    assert served <= best
