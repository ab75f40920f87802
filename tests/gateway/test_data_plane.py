"""The findings of the data-plane audit, each through a real gateway on loopback."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.hostile import HostileBackend, Play, chunked, completion, response, seed_of
from tests.support import sample, wait_until

Start = Callable[..., tuple[str, Any]]
CHAT = "/v1/chat/completions"
MODEL = "mistral-7b-chat"


def control(head: bytes) -> Play | None:
    """Answers for the gateway's own probes and scrapes."""
    if head.startswith(b"GET /health"):
        return Play(response(200, b"{}"))
    if head.startswith(b"GET "):
        return Play(response(404, b"{}"))
    return None


@pytest.fixture
def hostile() -> Iterator[Callable[..., HostileBackend]]:
    started: list[HostileBackend] = []

    def start(script: Any, **kw: Any) -> HostileBackend:
        def with_control(head: bytes, body: bytes, n: int) -> Play:
            return control(head) or script(head, body, n)

        b = HostileBackend(with_control, **kw)
        started.append(b)
        return b

    yield start
    for b in started:
        b.close()


def test_expect_100_continue_never_crosses_answers(
    start_worker: Start, start_gateway: Start
) -> None:
    """Finding 1: the README's repro, one worker, max_tokens 3, 5, 7, 9 with the header."""
    wurl, _ = start_worker()
    url, _ = start_gateway([wurl])
    with httpx.Client() as c:
        for n in (3, 5, 7, 9, 3, 5):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": n,
            }
            r = c.post(url + CHAT, json=body, headers={"expect": "100-continue"}, timeout=30)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == n


def test_expect_is_not_forwarded_and_interim_answers_are_skipped(
    hostile: Callable[..., HostileBackend], start_gateway: Start
) -> None:
    b = hostile(
        lambda h, body, n: Play(
            b"HTTP/1.1 100 Continue\r\n\r\n" + response(200, completion(seed_of(body)))
        )
    )
    url, _ = start_gateway([{"url": b.url, "models": [MODEL]}])
    for seed in range(6):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "seed": seed}
        r = httpx.post(url + CHAT, json=body, headers={"expect": "100-continue"})
        assert r.status_code == 200 and f"seed={seed}" in r.text
    posts = [h for h in b.requests if h.startswith(b"POST")]
    assert posts and not any(b"\r\nexpect:" in h.lower() for h in posts)


def test_one_backend_and_default_retries_fail_with_a_502_not_a_500(
    hostile: Callable[..., HostileBackend], start_gateway: Start
) -> None:
    """Finding 4, with the default `retries` (2) and fewer backends than that."""
    b = hostile(lambda h, body, n: Play(response(503, b'{"error": "busy"}')))
    url, _ = start_gateway([{"url": b.url, "models": [MODEL], "id": "only"}])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    r = httpx.post(url + CHAT, json=body)
    assert r.status_code == 502 and r.json()["error"]["message"]
    assert sample(httpx.get(url + "/metrics").text, "edgeroute_requests_total", status="502") == 1


def test_streams_answered_with_other_statuses_release_their_connection(
    hostile: Callable[..., HostileBackend], start_gateway: Start
) -> None:
    """Finding 6: 300 in the audit; 40 here, each on the same pooled connection."""
    b = hostile(lambda h, body, n: Play(response(400, b'{"error": {"message": "too long"}}')))
    url, gw = start_gateway([{"url": b.url, "models": [MODEL]}])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
    with httpx.Client() as c:
        for _ in range(40):
            assert c.post(url + CHAT, json=body).status_code == 400
    # Reused, not leaked (a leak is one per request; the gateway's probes and scrapes
    # hold a few of their own).
    assert b.connections < 10


def test_stream_tokens_are_counted_per_event_not_per_read(
    hostile: Callable[..., HostileBackend], start_gateway: Start
) -> None:
    """Finding 8: five events in one TCP write are five tokens."""
    events = [b'data: {"choices":[{"index":0,"delta":{"content":"t"}}]}\n\n' for _ in range(5)] + [
        b"data: [DONE]\n\n"
    ]
    b = hostile(lambda h, body, n: Play(chunked(200, [b"".join(events)])))
    url, _ = start_gateway([{"url": b.url, "models": [MODEL], "id": "h"}])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
    r = httpx.post(url + CHAT, json=body)
    assert r.status_code == 200 and r.text.count("data:") == 6
    metrics = httpx.get(url + "/metrics").text
    assert sample(metrics, "edgeroute_output_tokens_total", backend="h") == 5


def test_a_garbage_stream_mid_way_ends_with_an_error_event(
    hostile: Callable[..., HostileBackend], start_gateway: Start
) -> None:
    good = b'data: {"choices":[{"index":0,"delta":{"content":"t"}}]}\n\n'
    b = hostile(lambda h, body, n: Play(chunked(200, [good, b"<html>oops</html>\n"])))
    url, gw = start_gateway([{"url": b.url, "models": [MODEL], "id": "h"}])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
    text = httpx.post(url + CHAT, json=body).text
    assert "oops" not in text and "not server-sent events" in text
    assert gw.pool.get("h").circuit.failures == 1


def test_response_headers_and_bodies_over_the_limits_are_502s(
    hostile: Callable[..., HostileBackend], start_gateway: Start
) -> None:
    """Finding 9, the backend side: a 1 MB header, 20,000 header lines, a big body."""

    def script(head: bytes, body: bytes, n: int) -> Play:
        seed = seed_of(body)
        if seed == 0:
            return Play(response(200, completion(0), b"x-big: " + b"a" * (1 << 20)))
        if seed == 1:
            return Play(response(200, completion(1), *[b"x-%d: v" % i for i in range(20_000)]))
        if seed == 2:
            return Play(response(200, b'"' + b"x" * (3 << 20) + b'"'))
        return Play(response(200, completion(seed)))

    b = hostile(script)
    url, _ = start_gateway(
        [{"url": b.url, "models": [MODEL]}],
        retries=0,
        limits={"response_body_bytes": 1 << 20},
        circuit={"failures": 100, "open_seconds": 0.5},
    )
    for seed, words in ((0, "header"), (1, "header"), (2, "body")):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "seed": seed}
        r = httpx.post(url + CHAT, json=body)
        assert r.status_code == 502 and words in r.json()["error"]["message"], r.text
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "seed": 3}
    assert "seed=3" in httpx.post(url + CHAT, json=body).text


def raw_request(url: str, data: bytes, read: bool = True) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_request_headers_over_the_limits_get_a_431(
    start_worker: Start, start_gateway: Start
) -> None:
    """Finding 9, the client side: refused before anything is buffered or forwarded."""
    wurl, _ = start_worker()
    url, _ = start_gateway([wurl], limits={"request_header_bytes": 8192, "request_headers": 50})
    big = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 100_000 + b"\r\n\r\n"
    many = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        + b"".join(b"x-%d: v\r\n" % i for i in range(200))
        + b"\r\n"
    )
    for data in (big, many):
        answer = raw_request(url, data)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
        body = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert body["error"]["type"] == "invalid_request_error"
    assert httpx.get(url + "/healthz").status_code == 200


def test_idle_and_slowloris_connections_are_closed(
    start_worker: Start, start_gateway: Start
) -> None:
    """Finding 11: connections that never finish a request head are closed."""
    wurl, _ = start_worker()
    url, _ = start_gateway(
        [wurl],
        timeouts={
            "client_header": 0.5,
            "client_keepalive": 0.5,
            "first_byte": 2.0,
            "response": 2.0,
        },
    )
    host, port = url.removeprefix("http://").split(":")
    idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(20)]
    slow = [socket.create_connection((host, int(port)), timeout=30) for _ in range(20)]
    for s in slow:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
    for _ in range(3):  # keep dribbling: a header line now and then
        for s in slow:
            s.sendall(b"x-a: b\r\n")
    for s in idle + slow:
        assert s.recv(1) == b""  # the gateway closed it (recv blocks until then)
        s.close()


def test_a_client_leaving_mid_upload_is_one_info_line(
    start_worker: Start, start_gateway: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 12."""
    wurl, _ = start_worker()
    url, _ = start_gateway([wurl])
    caplog.set_level(logging.INFO)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n"
    for _ in range(5):
        raw_request(url, head + b'{"model": "', read=False)
    wait_until(
        lambda: (
            sample(
                httpx.get(url + "/metrics").text,
                "edgeroute_client_disconnects_total",
                phase="upload",
            )
            == 5
        )
    )
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len([r for r in caplog.records if "during its upload" in r.getMessage()]) == 5


def test_request_ids_come_back_as_sent_or_are_replaced(
    start_worker: Start, start_gateway: Start
) -> None:
    wurl, _ = start_worker()
    url, _ = start_gateway([wurl])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    r = httpx.post(url + CHAT, json=body, headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r = httpx.post(url + CHAT, json=body, headers=[(b"x-request-id", "é-ü".encode())])
    rid = r.headers.get_list("x-request-id")
    assert len(rid) == 1 and rid[0].isascii() and rid[0] != "é-ü"


def test_client_credentials_reach_backends_only_when_asked(
    hostile: Callable[..., HostileBackend], start_gateway: Start
) -> None:
    b = hostile(lambda h, body, n: Play(response(200, completion(seed_of(body)))))
    secret = {"authorization": "Bearer sk-user", "cookie": "session=s3cret"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "seed": 1}
    url, _ = start_gateway([{"url": b.url, "models": [MODEL]}])
    assert httpx.post(url + CHAT, json=body, headers=secret).status_code == 200
    url2, _ = start_gateway([{"url": b.url, "models": [MODEL]}], forward_client_credentials=True)
    assert httpx.post(url2 + CHAT, json=body, headers=secret).status_code == 200
    posts = [h.lower() for h in b.requests if h.startswith(b"POST")]
    assert b"sk-user" not in posts[0] and b"s3cret" not in posts[0]
    assert b"sk-user" in posts[1] and b"s3cret" in posts[1]


@pytest.mark.parametrize("token", ["", "   ", "\t"])
def test_a_blank_admin_token_means_closed(start_gateway: Start, token: str) -> None:
    """Finding 10."""
    url, gw = start_gateway([], admin_token=token)
    assert gw.settings.admin_token is None
    for given in (b"Bearer ", b"Bearer    ", b"Bearer " + token.encode(), b"Bearer"):
        head = b"GET /admin/backends HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
        answer = raw_request(url, head + b"authorization: " + given + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 401"), answer[:60]


def test_backend_urls_with_credentials_are_refused(start_gateway: Start) -> None:
    with pytest.raises(ValueError, match="credentials"):
        start_gateway([{"url": "http://user:pw@127.0.0.1:9"}])


def test_a_hung_backend_that_answers_health_is_found_out_by_its_stall(
    start_worker: Start, start_gateway: Start
) -> None:
    """Finding 5: it hangs on completions but answers /health; its waiting requests are
    moved and its circuit opens after `stall`, well before the response timeout."""
    hung_url, hung = start_worker(enable_faults=True, fault={"mode": "hang"})
    ok_url, _ = start_worker()
    url, gw = start_gateway(
        [{"url": hung_url, "id": "hung"}, {"url": ok_url, "id": "ok"}],
        routing={"default": {"policy": "round_robin"}},
        timeouts={"first_byte": 600, "response": 600, "stall": 1.0, "connect": 0.5, "scrape": 0.5},
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    answers = [httpx.post(url + CHAT, json=body, timeout=600) for _ in range(4)]
    assert all(r.status_code == 200 for r in answers)
    assert {r.headers["x-edgeroute-backend"] for r in answers} == {"ok"}
    metrics = httpx.get(url + "/metrics").text
    assert sample(metrics, "edgeroute_backend_stalls_total", backend="hung") >= 1
    assert sample(metrics, "edgeroute_retries_total", backend="hung", reason="stalled") >= 1
    assert gw.pool.get("hung").circuit.state.name in ("OPEN", "HALF_OPEN")


def test_an_answer_named_for_another_request_is_refused(
    hostile: Callable[..., HostileBackend], start_gateway: Start
) -> None:
    other = orjson.dumps({"id": "chatcmpl-someone-else", "choices": []})
    b = hostile(lambda h, body, n: Play(response(200, other)))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    url, _ = start_gateway([{"url": b.url, "models": [MODEL], "echoes_request_id": True}])
    r = httpx.post(url + CHAT, json=body, headers={"x-request-id": "mine"})
    assert r.status_code == 502 and "another request" in r.json()["error"]["message"]
    url2, _ = start_gateway([{"url": b.url, "models": [MODEL]}])  # the check is opt-in
    assert httpx.post(url2 + CHAT, json=body, headers={"x-request-id": "mine"}).status_code == 200


def _rid(head: bytes) -> str:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"x-request-id:"):
            return line.split(b":", 1)[1].strip().decode()
    return "none"


def _named_stream(name: str, with_id: bool = True) -> bytes:
    chunk: dict[str, Any] = {"object": "chat.completion.chunk", "choices": []}
    if with_id:
        chunk["id"] = name
    return chunked(200, [b"data: " + orjson.dumps(chunk) + b"\n\n", b"data: [DONE]\n\n"])


@pytest.mark.parametrize(
    "answer",
    [
        _named_stream("chatcmpl-someone-else"),
        _named_stream("chatcmpl-mine", with_id=False),
    ],
    ids=["named-for-another", "unnamed"],
)
def test_a_trickled_stream_is_checked_on_its_first_whole_event(
    hostile: Callable[..., HostileBackend], start_gateway: Start, answer: bytes
) -> None:
    """Sent three bytes at a time, the first read holds no name: the gateway reads on
    to the first whole event before it relays anything."""
    b = hostile(lambda h, body, n: Play(answer, split=3))
    url, _ = start_gateway([{"url": b.url, "models": [MODEL], "echoes_request_id": True}])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
    r = httpx.post(url + CHAT, json=body, headers={"x-request-id": "mine"}, timeout=60)
    assert r.status_code == 502 and "another request" in r.json()["error"]["message"]


def test_an_answer_naming_another_request_in_its_header_is_refused(
    hostile: Callable[..., HostileBackend], start_gateway: Start
) -> None:
    b = hostile(
        lambda h, body, n: Play(
            response(200, orjson.dumps({"id": "chatcmpl-mine"}), b"x-request-id: theirs")
        )
    )
    url, _ = start_gateway([{"url": b.url, "models": [MODEL], "echoes_request_id": True}])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    r = httpx.post(url + CHAT, json=body, headers={"x-request-id": "mine"})
    assert r.status_code == 502 and "another request" in r.json()["error"]["message"]


def test_a_connection_out_of_step_is_never_reused(
    hostile: Callable[..., HostileBackend], start_gateway: Start
) -> None:
    """The backend first answers request `a` with bytes that are not its answer (an
    event stream to a plain request), then, late, with `a`'s real answer. Had the
    connection gone back to the pool, request `b` would be sent on it and be handed
    `a`'s answer; it must get its own, on a new connection."""

    def script(head: bytes, body: bytes, n: int) -> Play:
        rid = _rid(head)
        real = response(200, orjson.dumps({"id": f"chatcmpl-{rid}", "choices": []}))
        if rid == "a":
            return Play(_named_stream("chatcmpl-a"), late=real, late_after=1.0)
        return Play(real)

    b = hostile(script)
    url, _ = start_gateway(
        [{"url": b.url, "models": [MODEL], "echoes_request_id": True}], retries=0
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    with httpx.Client(timeout=60) as c:
        first = c.post(url + CHAT, json=body, headers={"x-request-id": "a"})
        assert first.status_code == 502 and "not JSON" in first.json()["error"]["message"]
        second = c.post(url + CHAT, json=body, headers={"x-request-id": "b"})
    assert second.status_code == 200, second.text
    assert second.json()["id"] == "chatcmpl-b"


def test_a_plain_answer_to_a_stream_fails_at_its_first_byte(
    hostile: Callable[..., HostileBackend], start_gateway: Start
) -> None:
    """A JSON body has no newline: had the gateway waited for a whole line to judge
    it, a body that never ends would hold the request until the idle timeout."""
    endless = b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n" + b'{"id": "x", "choices"'
    b = hostile(lambda h, body, n: Play(endless))
    url, _ = start_gateway(
        [{"url": b.url, "models": [MODEL]}],
        timeouts={"first_byte": 600, "response": 600, "idle": 600},
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
    r = httpx.post(url + CHAT, json=body, timeout=60)
    assert r.status_code == 502 and "not server-sent events" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "answer",
    [
        response(200, orjson.dumps({"id": "embd-someone-else", "object": "list", "data": []})),
        _named_stream("embd-mine"),  # events, where a whole answer was due
    ],
    ids=["named-for-another", "streamed"],
)
def test_an_embedding_that_is_not_this_requests_goes_to_the_next_backend(
    hostile: Callable[..., HostileBackend],
    start_worker: Start,
    start_gateway: Start,
    answer: bytes,
) -> None:
    """Embeddings are checked as completions are: another request's answer, or bytes
    that are not a whole JSON answer, never reach the client; the request moves on to
    the honest backend."""
    tried: list[bytes] = []

    def script(head: bytes, body: bytes, n: int) -> Play:
        tried.append(head.split(b" ", 2)[1])
        return Play(answer)

    b = hostile(script)
    honest, _ = start_worker()
    url, _ = start_gateway(
        [
            {"url": b.url, "id": "hostile", "models": [MODEL], "echoes_request_id": True},
            {"url": honest, "id": "honest", "echoes_request_id": True},
        ],
        routing={"default": {"policy": "round_robin"}},
    )
    body = {"model": MODEL, "input": ["a", "b"]}
    for i in range(4):
        r = httpx.post(url + "/v1/embeddings", json=body, headers={"x-request-id": f"mine{i}"})
        assert r.status_code == 200 and r.headers["x-edgeroute-backend"] == "honest"
        assert r.json()["id"] == f"embd-mine{i}" and len(r.json()["data"]) == 2
    assert tried and set(tried) == {b"/v1/embeddings"}  # it was tried, and passed over
