"""`best_predicted` (the QoS papers' BR baseline) served by the gateway: real workers
serving three of RouterBench's models, RouterBench's predictor named in the spec, the
official SDK."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai

from policies.predictor import DEFAULT_PREDICTOR_DIR, MODEL_ROOT, load_predictor
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


def test_a_backend_named_for_the_predictor_is_read_as_that_model(
    start_worker: Start, start_gateway: Start
) -> None:
    """`predicted_as`: two backends serving names the default predictor does not know
    are read as the models their config names. On a prompt the predictor tells those
    two apart on, every answer comes from the one read as the better. Their twin, the
    same backends unnamed, are both the mean of all models: tied, each takes some (all
    20 on one: p = 2^-19)."""
    predictor = load_predictor(DEFAULT_PREDICTOR_DIR)
    prompt = "What is the smallest possible integer value of $x$ if $12\\div(x+1)$ is an integer?"
    (weak, _), (strong, _) = predictor.predict(prompt, [0, 1])
    assert strong > weak
    urls = {}
    for name in ("alpha", "beta"):
        urls[name], _ = start_worker(
            profile="mistral-7b-chat", served_model_names=[name, MODEL], speedup=50.0
        )
    named = [
        {"url": urls["alpha"], "id": "alpha", "predicted_as": predictor.models[0]},
        {"url": urls["beta"], "id": "beta", "predicted_as": predictor.models[1]},
    ]
    unnamed = [{"url": urls[n], "id": n} for n in ("alpha", "beta")]
    spec = {"default": {"policy": "best_predicted"}}
    served = {}
    for case, backends in (("named", named), ("unnamed", unnamed)):
        url, _ = start_gateway(backends, routing=spec)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        served[case] = [
            client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=2
            ).headers["x-edgeroute-backend"]
            for _ in range(20)
        ]
    assert set(served["named"]) == {"beta"}
    assert set(served["unnamed"]) == {"alpha", "beta"}
