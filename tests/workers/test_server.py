"""The worker's OpenAI API, as vLLM's clients see it."""

from __future__ import annotations

import ast
import csv
import gzip
import os
from collections.abc import Callable

import httpx
import openai
import pytest

from policies.text import estimate_tokens
from tests.support import DATA_DIR
from workers.server import Worker

MODEL = "mistral-7b-chat"
Start = Callable[..., tuple[str, Worker]]


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_chat_non_streaming_usage_is_exact(start_worker: Start) -> None:
    url, _ = start_worker()
    r = client(url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say something."}], max_tokens=7
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.usage is not None
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == estimate_tokens("Say something.")
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_chat_streaming_chunks_done_and_usage(start_worker: Start) -> None:
    url, _ = start_worker()
    stream = client(url).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream please."}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 5
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    raw = httpx.post(
        url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 2,
            "stream": True,
        },
    ).text
    assert raw.rstrip().endswith("data: [DONE]")


def test_text_is_deterministic_for_a_seed(start_worker: Start) -> None:
    url, _ = start_worker()
    c = client(url)
    msgs = [{"role": "user", "content": "Same prompt."}]
    a = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, seed=42)  # type: ignore[arg-type]
    b = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, seed=42)  # type: ignore[arg-type]
    d = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, seed=43)  # type: ignore[arg-type]
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].message.content != d.choices[0].message.content


def test_stop_strings_are_honoured(start_worker: Start) -> None:
    url, _ = start_worker()
    c = client(url)
    msgs = [{"role": "user", "content": "Stop test."}]
    full = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=30, seed=5)  # type: ignore[arg-type]
    text = full.choices[0].message.content or ""
    word = text.split()[10]
    cut = c.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_tokens=30,
        seed=5,  # type: ignore[arg-type]
        stop=[word],
    )
    assert cut.choices[0].finish_reason == "stop"
    out = cut.choices[0].message.content or ""
    assert word not in out.split() and text.startswith(out)
    assert cut.usage is not None and cut.usage.completion_tokens < 30


def test_completions_endpoint(start_worker: Start) -> None:
    url, _ = start_worker()
    r = client(url).completions.create(model=MODEL, prompt="Once upon", max_tokens=4)
    assert r.object == "text_completion" and r.usage is not None
    assert r.usage.completion_tokens == 4 and r.choices[0].text


def test_models_health_load_and_errors(start_worker: Start) -> None:
    url, _ = start_worker(served_model_names=[MODEL, "alias"])
    ids = [m.id for m in client(url).models.list()]
    assert ids == [MODEL, "alias"]
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/load").json() == {"server_load": 0}
    bad = httpx.post(url + "/v1/chat/completions", json={"model": "nope", "messages": []})
    assert bad.status_code == 404 and bad.json()["error"]["param"] == "model"
    n2 = httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2},
    )
    assert n2.status_code == 400
    huge = httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9},
    )
    assert huge.status_code == 400 and "context length" in huge.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        client(url).chat.completions.create(model=MODEL, messages=[], max_tokens=0)


def test_metrics_use_vllm_names_current_and_older(start_worker: Start) -> None:
    url, _ = start_worker()
    client(url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    text = httpx.get(url + "/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:time_per_output_token_seconds_bucket",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ):
        assert f"\n{name}{{" in text, name
    assert 'vllm:generation_tokens_total{model_name="mistral-7b-chat"} 3.0' in text


def _routerbench_rows(n: int) -> list[dict[str, str]]:
    path = DATA_DIR / "router_quality" / "routerbench_0shot_mbpp_test.csv.gz"
    csv.field_size_limit(1 << 30)
    with gzip.open(path, "rt", newline="") as fh:
        return [row for _, row in zip(range(n), csv.DictReader(fh), strict=False)]


@pytest.mark.skipif(
    not DATA_DIR.exists() and not os.environ.get("CI"),  # CI has the data: never skip there
    reason="needs the data folder (../shared/data or EDGEROUTE_DATA_DIR)",
)
def test_dataset_prompts_replay_the_models_real_lengths_and_scores(start_worker: Start) -> None:
    url, _ = start_worker(profile="llama-2-70b-chat", speedup=50.0)
    c = client(url)
    column = "meta/llama-2-70b-chat"
    for row in _routerbench_rows(6):
        prompt = "\n".join(ast.literal_eval(row["prompt"]))
        response = "\n".join(ast.literal_eval(row[column + "|model_response"]))
        raw = c.chat.completions.with_raw_response.create(
            model="llama-2-70b-chat", messages=[{"role": "user", "content": prompt}]
        )
        r = raw.parse()
        assert r.usage is not None
        assert r.usage.completion_tokens == estimate_tokens(response)
        assert raw.headers["x-emulated-source"] == "dataset"
        assert float(raw.headers["x-emulated-score"]) == float(row[column])
        assert raw.headers["x-emulated-task"] == "mbpp"


def test_other_prompts_draw_from_the_models_task_distribution(start_worker: Start) -> None:
    url, _ = start_worker(speedup=50.0)
    raw = client(url).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Not from any data set, surely."}],
        extra_headers={"x-edgeroute-task": "mbpp"},
    )
    assert raw.headers["x-emulated-source"] == "distribution"
    assert raw.headers["x-emulated-task"] == "mbpp"
    assert float(raw.headers["x-emulated-score"]) in (0.0, 1.0)
