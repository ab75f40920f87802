"""The gateway reads load from the engines people run: vLLM (tested throughout with the
emulated workers), SGLang and llama.cpp. The engines here are stand-ins that export
each one's metric names (the engines themselves are outside the project; the real
llama.cpp run is tests/test_real_engine.py, optional)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from tests.support import ServerThread, wait_until

Start = Callable[..., tuple[str, Any]]
TOKEN = {"authorization": "Bearer test-admin-token"}

LLAMA_CPP = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 3
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.25
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 1234
"""
SGLANG = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 5.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.25
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 1234.0
"""


def engine(metrics: str) -> Starlette:
    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def prometheus(request: Request) -> PlainTextResponse:
        return PlainTextResponse(metrics)

    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/health", health),
            Route("/metrics", prometheus),
        ]
    )


@pytest.mark.parametrize("metrics", [LLAMA_CPP, SGLANG], ids=["llama.cpp", "sglang"])
def test_engine_load_is_read_under_each_engines_names(
    servers: ServerThread, start_gateway: Start, metrics: str
) -> None:
    url, _ = servers.serve(engine(metrics))
    gw, _ = start_gateway([{"url": url, "id": "e"}])

    def state() -> dict[str, Any]:
        backends: list[dict[str, Any]] = httpx.get(gw + "/admin/backends", headers=TOKEN).json()[
            "backends"
        ]
        return backends[0]

    wait_until(lambda: state()["stats_age_s"] is not None)
    got = state()
    assert (got["running"], got["waiting"], got["kv_usage"]) == (3, 5, 0.25)
    assert got["models"] == ["m"]


def test_a_drained_backend_is_healthy_and_not_accepting(
    start_worker: Start, start_gateway: Start
) -> None:
    w, _ = start_worker()
    gw, _ = start_gateway([{"url": w, "id": "w"}])
    httpx.post(gw + "/admin/backends/w/drain", headers=TOKEN).raise_for_status()
    (got,) = httpx.get(gw + "/admin/backends", headers=TOKEN).json()["backends"]
    assert (got["healthy"], got["draining"], got["accepting"]) == (True, True, False)


def test_a_whole_answers_progress_survives_an_engine_whose_counter_restarts(
    servers: ServerThread, start_gateway: Start
) -> None:
    """The hostile twin of the progress estimate: an engine's generation counter that
    goes back to near zero (a restart) credits nothing, and counting resumes from
    there; the held request is never credited more than the engine made."""
    counter = [1000.0]
    release = threading.Event()

    async def prometheus(request: Request) -> PlainTextResponse:
        return PlainTextResponse(
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
            f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total {counter[0]}\n"
        )

    async def chat(request: Request) -> JSONResponse:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)
        usage = {"prompt_tokens": 5, "completion_tokens": 20, "total_tokens": 25}
        return JSONResponse({"id": "x", "object": "chat.completion", "choices": [], "usage": usage})

    app = engine("")
    app.router.routes[-1] = Route("/metrics", prometheus)
    app.router.routes.append(Route("/v1/chat/completions", chat, methods=["POST"]))
    url, _ = servers.serve(app)
    # The request is held over several scrapes: on a loaded machine that is longer than
    # the tests' usual 2 s answer timeout.
    timeouts = {"connect": 5.0, "first_byte": 60.0, "response": 60.0, "idle": 60.0}
    gw_url, gw = start_gateway([{"url": url, "id": "e"}], timeouts=timeouts)
    # Turned on by hand (no policy here reads the requests), after the first store sync,
    # which applies the routing config and with it what the policies need.
    wait_until(lambda: gw.monitor.config_version != -1)
    servers.call(lambda: setattr(gw.pool, "track_requests", True))

    def held() -> list[int]:
        view = servers.call(lambda: gw.pool.view)
        return [r.generated for b in view.backends for r in b.requests]

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    statuses: list[int] = []
    client = threading.Thread(
        target=lambda: statuses.append(
            httpx.post(gw_url + "/v1/chat/completions", json=body, timeout=60).status_code
        )
    )
    client.start()
    try:
        wait_until(lambda: len(held()) == 1)
        scraped = gw.pool.get("e").stats.scraped_at
        wait_until(lambda: gw.pool.get("e").stats.scraped_at > scraped)
        counter[0] = 1010.0
        wait_until(lambda: held() == [10])
        counter[0] = 3.0  # restarted
        scraped = gw.pool.get("e").stats.scraped_at
        wait_until(lambda: gw.pool.get("e").stats.scraped_at > scraped)
        wait_until(lambda: gw.pool.get("e").stats.generated_total == 3.0)
        assert held() == [10]
        counter[0] = 7.0
        wait_until(lambda: held() == [14])
    finally:
        release.set()
        client.join(60)
    assert statuses == [200]
    wait_until(lambda: held() == [])
