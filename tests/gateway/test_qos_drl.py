"""The QoS-DRL policy served by the gateway, with real workers and ONNX graphs.

The actors here are untrained networks whose drop logit is forced, so the test knows
what each must decide; the trained model is evaluated by `edgeroute bench qos`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from edgeroute.qos.export import export_actor
from edgeroute.qos.model import QoSNet
from edgeroute.qos.predictors import train_predictor
from tests.support import (
    DATA_DIR,
    RedisProcess,
    ServerThread,
    hold_streams,
    needs_data,
    sample,
    wait_until,
)

Start = Callable[..., tuple[str, Any]]
TOKEN = {"authorization": "Bearer test-admin-token"}
MODEL = "edge"
OUTCOMES = ("met", "missed", "failed", "shed")
pytestmark = needs_data("the quality data")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    base = tmp_path_factory.mktemp("qos")
    train_predictor(DATA_DIR, "bow", epochs=1, out=base / "predictor")
    dirs = {}
    names = ("route", "shed", "even", "prior", "load")
    for name, bias in zip(names, (-100.0, 100.0, -100.0, -100.0, -100.0), strict=True):
        torch.manual_seed(0)
        net = QoSNet(load=name == "load")
        with torch.no_grad():
            drop, expert = net.head.drop[-1], net.head.expert[-1]
            assert isinstance(drop, torch.nn.Linear) and isinstance(expert, torch.nn.Linear)
            drop.bias.fill_(bias)
            if name == "even":  # every backend's logit the same, whatever it sees
                expert.weight.zero_()
        d = base / name
        export_actor(net, d / "actor.onnx", speed_prior=name == "prior")
        for f in ("predictor.onnx", "predictor.json"):
            (d / f).write_bytes((base / "predictor" / f).read_bytes())
        dirs[name] = d
    yield dirs


def start(
    start_worker: Start,
    start_gateway: Start,
    model_dir: Path,
    keep_warm_ms: float = 0.0,
    keep_warm_for_ms: float = 1000.0,
    gateway: dict[str, Any] | None = None,
    **params: Any,
) -> tuple[str, Any]:
    backends = []
    for profile in ("mistral-7b-chat", "llama-2-70b-chat", "Yi-34B-Chat"):
        url, _ = start_worker(profile=profile, served_model_names=[profile, MODEL], speedup=2.0)
        backends.append({"url": url, "id": profile})
    spec = {"policy": "qos_drl", "model": str(model_dir), "params": params}
    return start_gateway(
        backends,
        routing={"default": spec},
        keep_warm_ms=keep_warm_ms,
        keep_warm_for_ms=keep_warm_for_ms,
        **(gateway or {}),
    )


def warmups(url: str) -> float:
    metrics = httpx.get(url + "/metrics").text
    return sample(metrics, "edgeroute_policy_warmups_total", policy="qos_drl")


def test_while_idle_the_gateway_repeats_the_last_decision_to_keep_it_warm(
    start_worker: Start, start_gateway: Start, models: dict[str, Path]
) -> None:
    """With `keep_warm_ms` the gateway, by itself, repeats the policy's last decision
    while no request comes; before the first there is none to repeat, and requests
    are answered as before."""
    url, _ = start(start_worker, start_gateway, models["route"], keep_warm_ms=1.0)
    assert warmups(url) == 0  # nothing decided yet
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    first = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert first.choices[0].message.content
    wait_until(lambda: warmups(url) >= 5)
    again = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert again.choices[0].message.content


def test_the_warm_ups_stop_when_no_request_came_for_the_window_and_resume_with_one(
    start_worker: Start, start_gateway: Start, models: dict[str, Path]
) -> None:
    """`keep_warm_for_ms`: a gateway without traffic goes quiet. After one request the
    warm-ups run, then stop once the window has passed (the count holds still over half
    a second, and after another second); the next request starts them again."""
    url, _ = start(
        start_worker, start_gateway, models["route"], keep_warm_ms=1.0, keep_warm_for_ms=300.0
    )
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

    def ask() -> None:
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert answer.choices[0].message.content

    def holds_still() -> bool:
        before = warmups(url)
        time.sleep(0.5)
        return warmups(url) == before

    ask()
    wait_until(lambda: warmups(url) >= 5)
    wait_until(holds_still, timeout=30.0)
    quiet = warmups(url)
    time.sleep(1.0)
    assert warmups(url) == quiet  # no request, no warm-up
    ask()
    wait_until(lambda: warmups(url) > quiet)


def test_by_default_the_gateway_does_not_repeat_decisions(
    start_worker: Start, start_gateway: Start, models: dict[str, Path]
) -> None:
    url, _ = start(start_worker, start_gateway, models["route"])
    for _ in range(3):
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert r.status_code == 200
    time.sleep(0.2)  # idle, where a 1 ms keep-warm would have run many times
    assert warmups(url) == 0


def test_a_sampling_policy_spreads_what_it_draws_over_the_backends(
    start_worker: Start, start_gateway: Start, models: dict[str, Path]
) -> None:
    """`sample: true`: each request's action is drawn from the actor's distribution,
    by the gateway's own per-request entropy, and every drawn request is answered. The
    actor weighs the three backends alike, so its most likely action is always the
    first; drawn, all three are taken (that all 24 land on one: p = 3^-23)."""
    url, _ = start(start_worker, start_gateway, models["even"], sample=True)
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    for _ in range(24):
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert answer.choices[0].message.content
    metrics = httpx.get(url + "/metrics").text
    counts = [
        sample(metrics, "edgeroute_policy_decisions_total", policy="qos_drl", backend=b)
        for b in ("mistral-7b-chat", "llama-2-70b-chat", "Yi-34B-Chat")
    ]
    assert sum(counts) == 24 and sum(c > 0 for c in counts) >= 2


def test_the_learned_policy_routes_and_sees_the_inflight_requests(
    servers: ServerThread, start_worker: Start, start_gateway: Start, models: dict[str, Path]
) -> None:
    url, gw = start(start_worker, start_gateway, models["route"])
    assert gw.pool.track_requests

    def backends() -> Any:
        return servers.call(lambda: gw.pool.view).backends

    stop = threading.Event()
    threads = hold_streams(url, MODEL, 3, stop, content="Write a long story.")
    try:
        # The view carries the gateway's in-flight requests with their streamed progress.
        wait_until(lambda: sum(len(b.requests) for b in backends()) == 3)
        wait_until(
            lambda: any(r.generated > 2 for b in backends() for r in b.requests),
            timeout=5,
        )
        r = httpx.post(
            url + "/v1/chat/completions",
            json={
                "model": MODEL,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "Write a function that sorts a list."}],
            },
        )
        assert r.status_code == 200 and r.headers["x-edgeroute-backend"]
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    wait_until(lambda: sum(len(b.requests) for b in backends()) == 0)
    # Four QoS decisions; the finished request is judged against the latency target and
    # the three streams the client cut are not.
    metrics = httpx.get(url + "/metrics").text
    assert sample(metrics, "edgeroute_qos_predicted_score_count") == 4
    outcomes = {o: sample(metrics, "edgeroute_qos_requests_total", outcome=o) for o in OUTCOMES}
    assert outcomes["met"] + outcomes["missed"] == 1 and outcomes["shed"] == 0
    assert sample(metrics, "edgeroute_requests_total", status="499") == 3
    assert sample(metrics, "edgeroute_qos_token_latency_seconds_count") == 1


def test_replicas_feed_an_actor_reading_the_load_the_arrivals_they_counted_together(
    start_worker: Start,
    start_gateway: Start,
    models: dict[str, Path],
    redis_server: RedisProcess,
) -> None:
    """Behind a load balancer each replica sees part of the traffic: one that received
    nothing still reads the model's arrival rate, from the replica that counted it."""
    store = {"redis_url": redis_server.url}
    url1, gw1 = start(
        start_worker, start_gateway, models["load"], gateway={**store, "replica_id": "r1"}
    )
    backends = [{"url": b.config.url, "id": b.id} for b in gw1.pool]
    spec = {"policy": "qos_drl", "model": str(models["load"])}
    url2, _ = start_gateway(backends, routing={"default": spec}, replica_id="r2", **store)
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(12):
        assert httpx.post(url1 + "/v1/chat/completions", json=body).status_code == 200

    def rates(url: str) -> tuple[float, float]:
        """The model's arrivals per second a replica counted, and those it heard of."""
        seen = httpx.get(url + "/admin/status", headers=TOKEN).json()["arrivals_per_s"]
        model = seen.get(MODEL, {"here": 0.0, "others": 0.0})
        return model["here"], model["others"]

    assert rates(url1)[0] > 0  # counted as the requests came, with no one asking
    # Once a sync after r1's last arrival has reached r2, r2 hears r1's rate as it was
    # published, faded since that arrival: never less than r1's is as read after it.
    wait_until(lambda: rates(url2)[1] >= rates(url1)[0] > 0, timeout=10)
    assert rates(url2)[0] == 0.0  # r2 counted nothing of its own, so publishes nothing
    assert rates(url1)[1] == 0.0
    for _ in range(3):
        assert httpx.post(url2 + "/v1/chat/completions", json=body).status_code == 200
    wait_until(lambda: rates(url1)[1] > 0, timeout=10)  # now r1 hears r2's


def test_whole_answer_requests_show_progress_from_the_engines_token_counter(
    servers: ServerThread, start_worker: Start, start_gateway: Start, models: dict[str, Path]
) -> None:
    """Nothing of a non-streamed answer reaches the gateway before it ends: its
    progress comes from the engine's generation counter, shared among its requests."""
    url, gw = start(start_worker, start_gateway, models["route"])
    answers: list[int] = []

    def whole() -> None:
        r = httpx.post(
            url + "/v1/chat/completions",
            timeout=60,
            json={
                "model": MODEL,
                "max_tokens": 300,
                "messages": [{"role": "user", "content": "Write a long story."}],
            },
        )
        assert r.status_code == 200
        answers.append(r.json()["usage"]["completion_tokens"])

    threads = [threading.Thread(target=whole) for _ in range(3)]
    for t in threads:
        t.start()
    seen: list[int] = []

    def progressing() -> bool:
        view = servers.call(lambda: gw.pool.view)
        seen[:] = [r.generated for b in view.backends for r in b.requests]
        return any(g > 2 for g in seen)

    wait_until(progressing, timeout=30)
    for t in threads:
        t.join(60)
    assert len(answers) == 3
    assert max(seen) <= max(answers)  # an estimate, never more than the engine made
    # Finished requests tell the policy each backend's seconds per token.
    wait_until(
        lambda: any(b.token_latency > 0 for b in servers.call(lambda: gw.pool.view).backends)
    )


def test_a_spec_naming_no_model_serves_the_agent_trained_for_engines(
    start_worker: Start, start_gateway: Start
) -> None:
    """`policy: qos_drl` alone serves the shipped agent for engines that queue rather
    than refuse (`models/qos/routerdc/expected-read`, trained without the drop action): with
    every engine already holding streams it still routes every request, and sheds none.
    Its twin, an actor that drops, sheds with a 503 (the test below)."""
    backends = []
    for profile, name in (
        ("mistral-7b-chat", "Mistral-7B-v0.1"),
        ("llama-2-70b-chat", "Meta-Llama-3-8B"),
        ("Yi-34B-Chat", "zephyr-7b-beta"),
    ):
        url, _ = start_worker(profile=profile, served_model_names=[name, MODEL], speedup=2.0)
        backends.append({"url": url, "id": name})
    url, _ = start_gateway(backends, routing={"default": {"policy": "qos_drl"}})
    stop = threading.Event()
    held = hold_streams(url, MODEL, 9, stop)
    try:
        wait_until(
            lambda: (
                sample(httpx.get(url + "/metrics").text, "edgeroute_replica_inflight_requests") >= 9
            )
        )
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for _ in range(6):
            answer = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Sort a list."}], max_tokens=2
            )
            assert answer.choices[0].message.content
    finally:
        stop.set()
        for t in held:
            t.join()
    metrics = httpx.get(url + "/metrics").text
    assert sample(metrics, "edgeroute_qos_requests_total", outcome="shed") == 0
    decided = [
        sample(metrics, "edgeroute_policy_decisions_total", policy="qos_drl", backend=b["id"])
        for b in backends
    ]
    assert sum(decided) == 15


def test_the_drop_action_sheds_with_503_and_retry_after(
    start_worker: Start, start_gateway: Start, models: dict[str, Path]
) -> None:
    url, _ = start(start_worker, start_gateway, models["shed"])
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    assert "shed by the QoS policy" in r.json()["error"]["message"]
    metrics = httpx.get(url + "/metrics").text
    assert sample(metrics, "edgeroute_qos_requests_total", outcome="shed") == 1
    assert sample(metrics, "edgeroute_shed_requests_total", reason="qos") == 1


def test_without_shedding_the_policy_serves_what_its_actor_would_drop(
    start_worker: Start, start_gateway: Start, models: dict[str, Path]
) -> None:
    url, _ = start(start_worker, start_gateway, models["shed"], shed=False)
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    metrics = httpx.get(url + "/metrics").text
    assert sample(metrics, "edgeroute_qos_requests_total", outcome="shed") == 0
    # an operator's typo is refused, not read as "shed"
    r = httpx.put(
        url + "/admin/routing/default",
        headers=TOKEN,
        json={"policy": "qos_drl", "model": str(models["shed"]), "params": {"shed": "no"}},
    )
    assert r.status_code == 400 and "shed must be true or false" in r.json()["error"]["message"]
    r = httpx.put(
        url + "/admin/routing/default",
        headers=TOKEN,
        json={"policy": "qos_drl", "model": str(models["shed"]), "params": {"sample": 1}},
    )
    assert r.status_code == 400 and "sample must be true or false" in r.json()["error"]["message"]
    r = httpx.put(
        url + "/admin/routing/default",
        headers=TOKEN,
        json={"policy": "qos_drl", "model": str(models["shed"]), "params": {"speed_prior": "on"}},
    )
    assert r.status_code == 400
    assert "speed_prior must be true or false" in r.json()["error"]["message"]
    # and a route that reads unmeasured backends at the mean measured speed serves
    r = httpx.put(
        url + "/admin/routing/default",
        headers=TOKEN,
        json={"policy": "qos_drl", "model": str(models["shed"]), "params": {"speed_prior": True}},
    )
    assert r.status_code == 200
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 503 and "shed by the QoS policy" in r.json()["error"]["message"]


def test_an_actor_trained_with_the_prior_is_not_served_without_it(
    start_worker: Start, start_gateway: Start, models: dict[str, Path]
) -> None:
    """A route cannot switch off the prior its actor was trained with: it would serve
    the actor features it never saw. Left unsaid, or said, the prior is on."""
    url, gw = start(start_worker, start_gateway, models["route"])
    spec = {"policy": "qos_drl", "model": str(models["prior"])}
    r = httpx.put(
        url + "/admin/routing/default",
        headers=TOKEN,
        json={**spec, "params": {"speed_prior": False}},
    )
    assert r.status_code == 400
    assert "trained with speed_prior" in r.json()["error"]["message"]
    assert gw.routing.default.model == str(models["route"])
    for params in ({}, {"speed_prior": True}):
        r = httpx.put(
            url + "/admin/routing/default", headers=TOKEN, json={**spec, "params": params}
        )
        assert r.status_code == 200
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


def test_a_learned_policy_without_its_model_files_is_refused(
    start_worker: Start, start_gateway: Start, models: dict[str, Path], tmp_path: Path
) -> None:
    url, gw = start(start_worker, start_gateway, models["route"])
    r = httpx.put(
        url + "/admin/routing/default",
        headers=TOKEN,
        json={"policy": "qos_drl", "model": str(tmp_path / "missing")},
    )
    assert r.status_code == 400 and "cannot be built" in r.json()["error"]["message"]
    assert gw.routing.default.model == str(models["route"])
