"""The gateway reads load from the engines people run: vLLM (tested throughout with the
emulated workers), SGLang and llama.cpp. The engines here are stand-ins that export
each one's metric names (the engines themselves are outside the project; the real
llama.cpp run is tests/test_real_engine.py, optional)."""

from __future__ import annotations

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
