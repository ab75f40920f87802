"""Hostile and absurd input: each gets a clear OpenAI-style error, and the gateway keeps
serving. (Bad JSON, bad schema, oversized bodies and unknown routes are in test_errors.)"""

from __future__ import annotations

import hmac
import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from gateway import auth
from tests.gateway.test_errors import assert_openai_error, chat_body

Start = Callable[..., tuple[str, Any]]
CHAT = "/v1/chat/completions"
TOKEN = {"authorization": "Bearer test-admin-token"}


@pytest.fixture
def gw(start_worker: Start, start_gateway: Start) -> Iterator[str]:
    wurl, _ = start_worker(speedup=50.0)
    url, _ = start_gateway([{"url": wurl, "id": "w"}])
    yield url


def still_serving(url: str) -> None:
    assert httpx.post(url + CHAT, json=chat_body(), timeout=10).status_code == 200


def test_deeply_nested_json_is_a_400(gw: str) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    body = b'{"model": "mistral-7b-chat", "messages": ' + deep + b"}"
    assert_openai_error(httpx.post(gw + CHAT, content=body), 400)
    still_serving(gw)


def test_invalid_utf8_is_a_400(gw: str) -> None:
    body = b'{"model": "mistral-7b-chat", "messages": [{"role": "user", "content": "\xff\xfe"}]}'
    err = assert_openai_error(httpx.post(gw + CHAT, content=body), 400)
    assert "JSON" in err["message"]
    still_serving(gw)


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_tokens", b"1000000000000"),
        ("max_tokens", b"-5"),
        ("max_tokens", b"0"),
        ("max_tokens", b'"many"'),
        ("max_completion_tokens", b"9223372036854775808"),
        ("temperature", b"-1"),
        ("temperature", b"1e999"),
        ("top_p", b"NaN"),
        ("n", b"1000000000"),
    ],
)
def test_absurd_generation_parameters_are_400s(gw: str, field: str, value: bytes) -> None:
    body = b'{"model": "mistral-7b-chat", "messages": [{"role": "user", "content": "hi"}], "'
    assert_openai_error(
        httpx.post(gw + CHAT, content=body + field.encode() + b'": ' + value + b"}"), 400
    )
    still_serving(gw)


@pytest.mark.parametrize(
    "body",
    [b'{"rack": NaN}', b'{"rack": -0.5}', b'{"rack": 1e999}', b'{"rack": "high"}', b"[1, 2]"],
)
def test_bad_congestion_updates_are_400s_and_change_nothing(gw: str, body: bytes) -> None:
    good = httpx.put(gw + "/admin/oracle/congestion", headers=TOKEN, json={"rack": 0.4})
    assert good.status_code == 200

    def state() -> dict[str, Any]:
        out = httpx.get(gw + "/admin/oracle", headers=TOKEN).json()
        del out["age_s"]  # grows by itself; `updated_at` shows whether anything changed
        return dict(out)

    before = state()
    r = httpx.put(gw + "/admin/oracle/congestion", headers=TOKEN, content=body)
    assert_openai_error(r, 400)
    assert state() == before


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/admin/backends/nope/drain"),
        ("POST", "/admin/backends/nope/undrain"),
        ("DELETE", "/admin/backends/nope"),
    ],
)
def test_admin_calls_on_unknown_backends_are_404s(gw: str, method: str, path: str) -> None:
    assert_openai_error(httpx.request(method, gw + path, headers=TOKEN), 404)


@pytest.mark.parametrize(
    "header",
    [
        {},
        {"authorization": "Bearer wrong"},
        {"authorization": "Bearer test-admin-token-and-more"},
        {"authorization": "Basic dGVzdC1hZG1pbi10b2tlbg=="},
        {"authorization": "test-admin-token"},
    ],
)
def test_admin_needs_exactly_the_token(gw: str, header: dict[str, str]) -> None:
    assert_openai_error(httpx.get(gw + "/admin/backends", headers=header), 401)


def test_tokens_are_compared_in_constant_time_against_every_candidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    keys = [SecretStr("sk-one"), SecretStr("sk-two"), SecretStr("sk-three")]
    assert auth.token_matches("sk-one", keys)
    # The match on the first key does not stop the comparison with the others.
    assert [b for _, b in compared] == [b"sk-one", b"sk-two", b"sk-three"]


def test_slowloris_clients_do_not_starve_others(gw: str) -> None:
    host, port = gw.removeprefix("http://").split(":")
    socks = []
    try:
        for _ in range(50):
            s = socket.create_connection((host, int(port)))
            # Headers promising a body that never comes, sent a few bytes at a time.
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            s.sendall(b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n{")
            socks.append(s)
        for _ in range(10):
            still_serving(gw)
        for s in socks:
            s.sendall(b'"m')  # still trickling: still held open, still harmless
        still_serving(gw)
    finally:
        for s in socks:
            s.close()
    still_serving(gw)
