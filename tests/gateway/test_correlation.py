"""Correlation under load: no client ever gets another client's answer, and none is lost.

Every request carries its own id (`x-request-id`), and the backends name their
answer after it, as vLLM does: a completion's `id`, and every stream chunk's, must be
`chatcmpl-<that id>`. Many clients send at once through one gateway in front of two
emulated workers, cycled through every fault they can inject, and a raw-socket
backend that breaks HTTP/1.1 in every way the conformance suite knows, with a
decoy answer behind its real ones. Each request ends in exactly one of:

- completed: status 200, the client's own id everywhere, a stream ended by [DONE];
- explicit error: an OpenAI-shaped error status, or a stream ended by an error event;
- crossed: any id that is not the client's own;
- lost: anything else (a cut connection, an empty success, a stream that just stops).

`EDGEROUTE_CORRELATION_REQUESTS` sets the number of requests per client (default 25).
"""

from __future__ import annotations

import os
import re
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from tests.hostile import HostileBackend, Play, chunked, response

Start = Callable[..., tuple[str, Any]]
MODEL = "mistral-7b-chat"
CLIENTS = 12
PER_CLIENT = int(os.environ.get("EDGEROUTE_CORRELATION_REQUESTS", "25"))
DECOY = "chatcmpl-DECOY"
_ID = re.compile(rb'"id"\s*:\s*"([^"]*)"')


def _answer(rid: str, stream: bool) -> bytes:
    if stream:
        parts = [
            b"data: "
            + orjson.dumps(
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"content": "x"}}],
                }
            )
            + b"\n\n"
            for _ in range(3)
        ]
        return chunked(200, [*parts, b"data: [DONE]\n\n"], trailers=b"x-t: 1\r\n", ext=b";e=1")
    body = orjson.dumps(
        {
            "id": rid,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )
    return response(200, body)


def hostile_script(head: bytes, body: bytes, n: int) -> Play:
    if head.startswith(b"GET /health"):
        return Play(response(200, b"{}"))
    if head.startswith(b"GET "):
        return Play(response(404, b"{}"))
    rid = "chatcmpl-" + next(
        (
            line.split(b":", 1)[1].strip().decode()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"x-request-id:")
        ),
        "none",
    )
    stream = b'"stream":true' in body.replace(b" ", b"")
    decoy = _answer(DECOY, stream)
    real = _answer(rid, stream)
    case = n % 6
    if case == 0:
        return Play(b"HTTP/1.1 100 Continue\r\n\r\n" + real)
    if case == 1:
        return Play(real + decoy)  # a second answer behind the first
    if case == 2:
        return Play(real, late=decoy)  # on the idle connection
    if case == 3:
        return Play(real, split=7)
    if case == 4:
        return Play(real, close=True)
    return Play(real + b"\r\n\r\ngarbage")


def classify(r: httpx.Response | None, rid: str, stream: bool, text: bytes) -> str:
    if r is None:
        return "lost"
    ids = {m.decode() for m in _ID.findall(text)}
    own = f"chatcmpl-{rid}"
    if ids - {own}:
        return "crossed"
    if r.headers.get("x-request-id") not in (None, rid):
        return "crossed"
    if r.status_code != 200:
        try:
            return "error" if orjson.loads(text)["error"]["message"] else "lost"
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return "lost"
    if not stream:
        return "completed" if ids == {own} else "lost"
    if text.rstrip().endswith(b"data: [DONE]") and own in ids:
        return "completed"
    if b'"error"' in text.rsplit(b"data:", 1)[-1]:
        return "error"
    return "lost"


def run_clients(url: str, stop_faults: threading.Event) -> Counter[str]:
    tally: Counter[str] = Counter()
    lock = threading.Lock()

    def client(c: int) -> None:
        with httpx.Client(timeout=60) as http:
            for i in range(PER_CLIENT):
                rid = f"c{c}-r{i}"
                stream = (c + i) % 2 == 0
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"request {rid}"}],
                    "max_tokens": 1 + (i % 4),
                    "stream": stream,
                }
                r: httpx.Response | None = None
                text = b""
                try:
                    with http.stream(
                        "POST",
                        url + "/v1/chat/completions",
                        json=body,
                        headers={"x-request-id": rid},
                    ) as r:
                        text = r.read()
                except httpx.HTTPError:
                    r = None
                verdict = classify(r, rid, stream, text)
                if verdict in ("crossed", "lost"):
                    print(
                        verdict,
                        rid,
                        stream,
                        r and r.status_code,
                        r and r.headers.get("x-edgeroute-backend"),
                        r and r.headers.get("x-request-id"),
                        text[:300],
                    )
                with lock:
                    tally[verdict] += 1
                    tally["sent"] += 1

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop_faults.set()
    return tally


def test_no_crossed_answers_and_no_silent_losses_under_every_fault(
    start_worker: Start, start_gateway: Start
) -> None:
    a_url, a = start_worker(enable_faults=True, speedup=50.0)
    b_url, b = start_worker(enable_faults=True, speedup=50.0)
    hostile = HostileBackend(hostile_script)
    try:
        url, _ = start_gateway(
            [
                {"url": a_url, "id": "a", "echoes_request_id": True},
                {"url": b_url, "id": "b", "echoes_request_id": True},
                {
                    "url": hostile.url,
                    "id": "hostile",
                    "models": [MODEL],
                    "echoes_request_id": True,
                },
            ],
            routing={"default": {"policy": "round_robin"}},
            circuit={"failures": 3, "open_seconds": 0.2},
        )
        stop = threading.Event()
        modes = ["error", "garbage", "abort", "hang", "none"]

        def faults() -> None:
            k = 0
            while not stop.wait(0.15):
                a.config.fault.mode = modes[k % len(modes)]
                b.config.fault.mode = modes[(k + 2) % len(modes)]
                k += 1
            a.config.fault.mode = b.config.fault.mode = "none"

        cycler = threading.Thread(target=faults)
        cycler.start()
        tally = run_clients(url, stop)
        cycler.join()
    finally:
        hostile.close()
    print("correlation:", dict(tally))
    assert tally["sent"] == CLIENTS * PER_CLIENT
    assert tally["crossed"] == 0, tally
    assert tally["lost"] == 0, tally
    assert tally["completed"] + tally["error"] == tally["sent"]
    assert tally["completed"] > tally["sent"] // 2, tally
