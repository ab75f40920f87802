"""One schema: the OpenAPI document and the checks agree, field by field."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import GatewayError
from gateway.request_schema import CHAT_BODY, CHAT_RULES, COMPLETION_RULES, validate

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


def test_the_document_lists_every_rule_and_the_required_ones() -> None:
    schema = CHAT_BODY["requestBody"]["content"]["application/json"]["schema"]
    assert list(schema["properties"]) == [r.name for r in CHAT_RULES]
    assert schema["required"] == ["model", "messages"]
    assert schema["additionalProperties"] is True


# A value each rule's schema refuses is refused by its check, with the field named.
BAD: dict[str, list[Any]] = {
    "model": ["", 3, None],
    "messages": [[], "hi", [{"content": "x"}], [{"role": "user", "content": 3}]],
    "prompt": [[], 3, None, [1, "a"], [[]], [-1], [True], [1.5], [[1], "a"], [[1], [2, "x"]]],
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


@pytest.mark.parametrize("rules", [CHAT_RULES, COMPLETION_RULES], ids=["chat", "completion"])
def test_every_rule_refuses_what_its_schema_refuses(rules: tuple[Any, ...]) -> None:
    base = CHAT if rules is CHAT_RULES else COMPLETION
    for rule in rules:
        for value in BAD[rule.name]:
            if value is None and not rule.required:
                continue
            body = {**base, rule.name: value}
            if value is None:
                del body[rule.name]
            with pytest.raises(GatewayError) as err:
                validate(body, rules is CHAT_RULES)
            assert err.value.status == 400 and err.value.param == rule.name, (rule.name, value)


def test_what_the_schema_allows_passes_and_unknown_fields_pass_through() -> None:
    body = {
        **CHAT,
        "stream": True,
        "max_tokens": 5,
        "temperature": 0,
        "stop": ["\n"],
        "seed": 7,
        "user": "u",
        "top_k": 40,  # a vLLM extra
    }
    assert validate(body, chat=True) is body
    for prompt in ("", ["a", "b"], [0, 1, 2], [[1, 2, 3]], [[1], [2, 3]]):
        assert validate({**COMPLETION, "prompt": prompt}, chat=False)  # token ids too
