"""The worker's OpenAI API, as vLLM's clients see it."""

from __future__ import annotations

import ast
import csv
import gzip
from collections.abc import Callable

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from policies.text import estimate_tokens
from tests.support import DATA_DIR, needs_data
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
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Same prompt."}]
    a = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, seed=42)
    b = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, seed=42)
    d = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, seed=43)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].message.content != d.choices[0].message.content


def test_stop_strings_are_honoured(start_worker: Start) -> None:
    url, _ = start_worker()
    c = client(url)
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Stop test."}]
    full = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=30, seed=5)
    text = full.choices[0].message.content or ""
    word = text.split()[10]
    cut = c.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_tokens=30,
        seed=5,
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


def test_completions_take_token_ids_and_batches_as_vllm_does(start_worker: Start) -> None:
    """A list of token ids is one prompt of that many tokens; a list of prompts (texts
    or lists of ids) is a batch: n choices per prompt, indexed prompt by prompt, each
    the answer that prompt alone gets, and the usage sums the prompts."""
    url, _ = start_worker()
    sdk = client(url)
    ids = list(range(100, 400))
    alone = sdk.completions.create(model=MODEL, prompt=ids, max_tokens=3)
    assert alone.usage is not None and alone.usage.prompt_tokens == 300
    prompts = ["Once upon", "a time, far away"]
    single = [sdk.completions.create(model=MODEL, prompt=p, max_tokens=4, n=2) for p in prompts]
    batch = sdk.completions.create(model=MODEL, prompt=prompts, max_tokens=4, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert [c.text for c in batch.choices] == [c.text for r in single for c in r.choices]
    assert batch.usage is not None and batch.usage.completion_tokens == 16
    assert batch.usage.prompt_tokens == sum(estimate_tokens(p) for p in prompts)
    # a given seed goes on from prompt to prompt: the same prompt twice, two answers
    seeded = sdk.completions.create(model=MODEL, prompt=[prompts[0]] * 2, max_tokens=4, seed=9)
    first = sdk.completions.create(model=MODEL, prompt=prompts[0], max_tokens=4, seed=9)
    assert seeded.choices[0].text == first.choices[0].text != seeded.choices[1].text
    streamed = ["", "", ""]
    for chunk in sdk.completions.create(
        model=MODEL, prompt=[ids, ids[:50], [7]], max_tokens=5, stream=True
    ):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert all(streamed)
    whole = sdk.completions.create(model=MODEL, prompt=[ids, ids[:50], [7]], max_tokens=5)
    assert [c.text for c in whole.choices] == streamed
    assert whole.usage is not None and whole.usage.prompt_tokens == 351
    bad: object
    for bad in ([], [1, "a"], [[]], [-3]):
        r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", bad


def test_models_health_load_and_errors(start_worker: Start) -> None:
    url, _ = start_worker(served_model_names=[MODEL, "alias"])
    ids = [m.id for m in client(url).models.list()]
    assert ids == [MODEL, "alias"]
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/load").json() == {"server_load": 0}
    bad = httpx.post(url + "/v1/chat/completions", json={"model": "nope", "messages": []})
    assert bad.status_code == 404 and bad.json()["error"]["param"] == "model"
    # n above the bound: refused in vLLM's error shape (n=2 works, see below).
    too_many = httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 17},
    )
    assert too_many.status_code == 400
    assert too_many.json() == {
        "error": {
            "message": "'n' must be an integer from 1 to 16",
            "type": "BadRequestError",
            "param": "n",
            "code": 400,
        }
    }
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


@needs_data("the quality data")
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


@needs_data("RouterDC's scores in router_quality/")
def test_a_worker_can_answer_as_a_routerdc_model_on_its_profiles_hardware(
    start_worker: Start,
) -> None:
    """`answers_as` takes the answers of another model of the quality data: RouterDC's
    graded score of that model on the prompt, not the profile's own model's."""
    model = "meta-math/MetaMath-Mistral-7B"
    path = DATA_DIR / "router_quality" / "routerdc_7model_scores.csv.gz"
    with gzip.open(path, "rt", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["source_file"] == "gsm8k-test"][:4]
    url, _ = start_worker(
        profile="mixtral-8x7b-chat", answers_as=model, served_model_names=[model], speedup=50.0
    )
    seen = set()
    for row in rows:
        raw = client(url).chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": row["question"]}]
        )
        assert raw.headers["x-emulated-source"] == "dataset"
        assert raw.headers["x-emulated-task"] == "gsm8k-test"
        assert float(raw.headers["x-emulated-score"]) == float(row[model])
        seen.add(float(row[model]))
    assert seen - {0.0, 1.0}  # graded scores among them, not only right or wrong


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


def test_the_task_travels_in_metadata_for_routers_that_drop_headers(start_worker: Start) -> None:
    url, _ = start_worker(speedup=50.0)
    prompt: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Not from any data set, surely."}
    ]
    raw = client(url).chat.completions.with_raw_response.create(
        model=MODEL, messages=prompt, extra_body={"metadata": {"task": "winogrande"}}
    )
    assert raw.headers["x-emulated-task"] == "winogrande"
    # The header wins over the body; metadata that is not a mapping of strings is ignored.
    raw = client(url).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=prompt,
        extra_headers={"x-edgeroute-task": "winogrande"},
        extra_body={"metadata": {"task": "arc-challenge"}},
    )
    assert raw.headers["x-emulated-task"] == "winogrande"

    def task_with(**extra: object) -> str:
        body = {"model": MODEL, "messages": prompt, "max_tokens": 2, **extra}
        r = httpx.post(url + "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return r.headers["x-emulated-task"]

    plain = task_with()
    assert plain != "winogrande"
    for metadata in ("winogrande", {"task": 7}, {"task": ""}, None, ["winogrande"]):
        assert task_with(metadata=metadata) == plain


def test_n_choices_whole_and_streamed(start_worker: Start) -> None:
    url, _ = start_worker()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Give me options."}]
    r = client(url).chat.completions.create(model=MODEL, messages=messages, max_tokens=6, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) == 3  # each choice drawn from its own seed
    assert r.usage is not None and r.usage.completion_tokens == 18
    one = client(url).chat.completions.create(model=MODEL, messages=messages, max_tokens=6)
    assert one.choices[0].message.content == texts[0]  # choice 0 is the n=1 answer
    stream = client(url).chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=6,
        n=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    streamed = ["", "", ""]
    finished = set()
    for chunk in stream:
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
            if c.finish_reason is not None:
                finished.add(c.index)
        if chunk.usage is not None:
            assert chunk.usage.completion_tokens == 18
    assert streamed == texts and finished == {0, 1, 2}


def test_logprobs_chat_and_completions(start_worker: Start) -> None:
    url, _ = start_worker()
    r = client(url).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=5,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 5
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        ranked = [a.logprob for a in t.top_logprobs]
        assert ranked == sorted(ranked, reverse=True) and t.top_logprobs[0].token == t.token
        assert sum(2.718281828**a for a in ranked) <= 1.0 + 1e-9  # a distribution's share
    plain = client(url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5
    )
    assert plain.choices[0].logprobs is None
    c = client(url).completions.create(model=MODEL, prompt="Once", max_tokens=4, logprobs=2)
    lp = c.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and len(lp.tokens) == 4
    assert "".join(lp.tokens) == c.choices[0].text
    assert lp.top_logprobs is not None and all(len(d) == 2 for d in lp.top_logprobs)
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(4)]
    # The hostile twin: alternatives without logprobs is refused, as vLLM refuses it.
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client(url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], top_logprobs=2
        )


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["C", "F"]},
            },
            "required": ["city", "days", "unit"],
        },
    },
}


def test_a_required_tool_call_whole_and_streamed(start_worker: Start) -> None:
    import json

    import jsonschema

    url, _ = start_worker()
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 200,
    }
    r = client(url).chat.completions.create(**ask)  # type: ignore[call-overload]
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])  # type: ignore[index]
    # Streamed as vLLM streams it: the call's id and name first, then its arguments.
    pieces, ids, names = [], set(), set()
    for chunk in client(url).chat.completions.create(**ask, stream=True):  # type: ignore[call-overload]
        for c in chunk.choices:
            for tc in c.delta.tool_calls or ():
                ids.add(tc.id) if tc.id else None
                names.add(tc.function.name) if tc.function and tc.function.name else None
                pieces.append(tc.function.arguments or "" if tc.function else "")
    assert ids == {call.id} and names == {"get_weather"}
    assert json.loads("".join(pieces)) == args
    # "auto" lets the model answer in text; a named tool that is not offered is refused.
    auto = client(url).chat.completions.create(**{**ask, "tool_choice": "auto"})  # type: ignore[call-overload]
    assert auto.choices[0].message.tool_calls is None and auto.choices[0].message.content
    named = {"type": "function", "function": {"name": "launch_rockets"}}
    with pytest.raises(openai.BadRequestError, match="launch_rockets"):
        client(url).chat.completions.create(**{**ask, "tool_choice": named})  # type: ignore[call-overload]


def test_response_format_json_object_and_schema(start_worker: Start) -> None:
    import json

    import jsonschema

    url, _ = start_worker()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "A person, as JSON."}]
    obj = client(url).chat.completions.create(
        model=MODEL, messages=messages, response_format={"type": "json_object"}, max_tokens=100
    )
    assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)
    schema: dict[str, object] = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "address": {
                "type": "object",
                "properties": {"zip": {"type": "string"}, "verified": {"type": "boolean"}},
                "required": ["zip", "verified"],
            },
        },
        "required": ["name", "age", "tags", "address"],
    }
    for seed in range(5):
        r = client(url).chat.completions.create(
            model=MODEL,
            messages=messages,
            seed=seed,
            max_tokens=300,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": schema},
            },
        )
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)
    # Cut short by max_tokens, as a model's JSON would be: finish_reason says so.
    cut = client(url).chat.completions.create(
        model=MODEL, messages=messages, response_format={"type": "json_object"}, max_tokens=2
    )
    assert cut.choices[0].finish_reason == "length"
    bad = httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "response_format": {"type": "yaml"}},
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format"


def test_ignore_eos_runs_to_max_tokens(start_worker: Start) -> None:
    url, _ = start_worker()
    # Answers are drawn per prompt and are usually shorter than 300 tokens; with vLLM's
    # ignore_eos the worker generates exactly max_tokens, as a trace replay needs.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 300}
    natural = httpx.post(url + "/v1/chat/completions", json=body).json()["usage"]
    forced = httpx.post(url + "/v1/chat/completions", json={**body, "ignore_eos": True}).json()[
        "usage"
    ]
    assert natural["completion_tokens"] < 300 == forced["completion_tokens"]
    bad = httpx.post(url + "/v1/chat/completions", json={**body, "ignore_eos": "yes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "ignore_eos"


def test_embeddings_run_through_the_engine_and_refuse_what_vllm_refuses(
    start_worker: Start,
) -> None:
    """Each input's prefill is engine work (its tokens counted as vLLM counts them);
    a longer vector than the model's, or an input past its context, is a 400."""
    from tests.support import sample

    url, w = start_worker()
    c = client(url)
    r = c.embeddings.create(model=MODEL, input=["one two three", "four"], encoding_format="float")
    assert r.object == "list" and [d.object for d in r.data] == ["embedding", "embedding"]
    tokens = estimate_tokens("one two three") + estimate_tokens("four")
    assert r.usage.prompt_tokens == r.usage.total_tokens == tokens
    metrics = httpx.get(url + "/metrics").text
    assert sample(metrics, "vllm:prompt_tokens_total") == tokens
    named = httpx.post(
        url + "/v1/embeddings",
        json={"model": MODEL, "input": "x"},
        headers={"x-request-id": "abc"},
    )
    assert named.json()["id"] == "embd-abc"  # named after the caller's id, as vLLM does
    with pytest.raises(openai.BadRequestError) as err:
        c.embeddings.create(model=MODEL, input="x", dimensions=257)
    assert err.value.body["param"] == "dimensions"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        c.embeddings.create(model=MODEL, input="word " * (w.profile.max_model_len + 10))
    assert err.value.body["param"] == "input"  # type: ignore[index]
