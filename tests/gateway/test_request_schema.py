"""One schema: the OpenAPI document and the checks agree, field by field."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import GatewayError
from gateway.request_schema import CHAT, COMPLETIONS, EMBEDDINGS, ENDPOINTS, Endpoint, validate

# The least each endpoint takes.
LEAST: dict[Endpoint, dict[str, Any]] = {
    CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    COMPLETIONS: {"model": "m", "prompt": "hi"},
    EMBEDDINGS: {"model": "m", "input": "hi"},
}


@pytest.mark.parametrize(
    ("endpoint", "required"),
    [
        (CHAT, ["model", "messages"]),
        (COMPLETIONS, ["model", "prompt"]),
        (EMBEDDINGS, ["model", "input"]),
    ],
    ids=["chat", "completion", "embedding"],
)
def test_the_document_lists_every_rule_and_the_required_ones(
    endpoint: Endpoint, required: list[str]
) -> None:
    schema = endpoint.openapi["requestBody"]["content"]["application/json"]["schema"]
    assert list(schema["properties"]) == [r.name for r in endpoint.rules]
    assert schema["required"] == required
    assert schema["additionalProperties"] is True
    assert ENDPOINTS[endpoint.path] is endpoint


# A value each rule's schema refuses is refused by its check, with the field named.
BAD: dict[str, list[Any]] = {
    "model": ["", 3, None],
    "messages": [[], "hi", [{"content": "x"}], [{"role": "user", "content": 3}]],
    "prompt": [[], 3, None, [1, "a"], [[]], [-1], [True], [1.5], [[1], "a"], [[1], [2, "x"]]],
    "input": [[], 3, None, [1, "a"], [[]], [-1], [True], [[1], "a"], {"text": "a"}],
    "encoding_format": ["hex", "", 3, ["float"]],
    "dimensions": [0, 1.5, True, (1 << 16) + 1, "8"],
    "stream": ["yes", 1],
    "stream_options": [[], "x"],
    "max_tokens": [0, 1 << 25, 1.5, True, "3"],
    "max_completion_tokens": [0, -1],
    "n": [0, 129],
    "temperature": [-0.1, 2.1, float("nan"), True, "1"],
    "top_p": [1.5, -1],
    "stop": [3, ["a", 3]],
    "user": [3, ["u"]],
    "seed": [1.5, "1", False],
}


@pytest.mark.parametrize("endpoint", list(LEAST), ids=["chat", "completion", "embedding"])
def test_every_rule_refuses_what_its_schema_refuses(endpoint: Endpoint) -> None:
    base = LEAST[endpoint]
    for rule in endpoint.rules:
        for value in BAD[rule.name]:
            if value is None and not rule.required:
                continue
            body = {**base, rule.name: value}
            if value is None:
                del body[rule.name]
            with pytest.raises(GatewayError) as err:
                validate(body, endpoint)
            assert err.value.status == 400 and err.value.param == rule.name, (rule.name, value)


def test_what_the_schema_allows_passes_and_unknown_fields_pass_through() -> None:
    body = {
        **LEAST[CHAT],
        "stream": True,
        "max_tokens": 5,
        "temperature": 0,
        "stop": ["\n"],
        "seed": 7,
        "user": "u",
        "top_k": 40,  # a vLLM extra
    }
    assert validate(body, CHAT) is body
    for prompt in ("", ["a", "b"], [0, 1, 2], [[1, 2, 3]], [[1], [2, 3]]):
        assert validate({**LEAST[COMPLETIONS], "prompt": prompt}, COMPLETIONS)  # token ids too
        assert validate({**LEAST[EMBEDDINGS], "input": prompt}, EMBEDDINGS)


def test_an_embedding_is_never_streamed() -> None:
    """No backend streams embeddings: asked to, the gateway refuses rather than wait
    for events that will not come; `stream: false` is what it does anyway."""
    embedding = {**LEAST[EMBEDDINGS], "encoding_format": "base64", "dimensions": 64}
    assert validate({**embedding, "stream": False}, EMBEDDINGS)
    with pytest.raises(GatewayError) as err:
        validate({**embedding, "stream": True}, EMBEDDINGS)
    assert err.value.status == 400 and err.value.param == "stream"
    assert "not streamed" in err.value.message
