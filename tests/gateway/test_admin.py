"""The admin API: token required, backends and routing changed at runtime."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support import wait_until

Start = Callable[..., tuple[str, Any]]
TOKEN = {"authorization": "Bearer test-admin-token"}
MODEL = "mistral-7b-chat"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.mark.parametrize(
    "path,method",
    [
        ("/admin/backends", "GET"),
        ("/admin/backends", "POST"),
        ("/admin/routing", "GET"),
        ("/admin/routing/default", "PUT"),
        ("/admin/backends/x/drain", "POST"),
        ("/admin/backends/x", "DELETE"),
        ("/admin/status", "GET"),
    ],
)
def test_admin_requires_the_token(
    start_worker: Start, start_gateway: Start, path: str, method: str
) -> None:
    w, _ = start_worker()
    url, _ = start_gateway([w])
    for headers in (
        {},
        {"authorization": "Bearer wrong"},
        {"authorization": "test-admin-token"},
        {"authorization": "Bearer test-admin-token-and-more"},
    ):
        r = httpx.request(method, url + path, headers=headers, json={})
        assert r.status_code == 401, (path, headers)
        assert r.json()["error"]["code"] == "invalid_token"
        assert r.headers["www-authenticate"] == "Bearer"


def test_admin_is_closed_when_no_token_is_configured(
    start_worker: Start, start_gateway: Start
) -> None:
    w, _ = start_worker()
    url, _ = start_gateway([w], admin_token=None)
    assert httpx.get(url + "/admin/backends", headers=TOKEN).status_code == 401


def test_backends_add_list_drain_undrain_remove(start_worker: Start, start_gateway: Start) -> None:
    a, _ = start_worker()
    b, _ = start_worker()
    url, _ = start_gateway([{"url": a, "id": "a"}], routing={"default": {"policy": "round_robin"}})
    r = httpx.post(url + "/admin/backends", headers=TOKEN, json={"url": b, "id": "b"})
    assert r.status_code == 201 and r.json()["id"] == "b"
    dup = httpx.post(url + "/admin/backends", headers=TOKEN, json={"url": b, "id": "b"})
    assert dup.status_code == 409
    listed = httpx.get(url + "/admin/backends", headers=TOKEN).json()["backends"]
    assert {x["id"] for x in listed} == {"a", "b"}
    # The new backend's models are discovered by the next scrape.
    wait_until(
        lambda: all(
            b["models"]
            for b in httpx.get(url + "/admin/backends", headers=TOKEN).json()["backends"]
        )
    )
    seen = Counter(
        httpx.post(url + "/v1/chat/completions", json=BODY).headers["x-edgeroute-backend"]
        for _ in range(6)
    )
    assert seen == {"a": 3, "b": 3}
    assert httpx.post(url + "/admin/backends/a/drain", headers=TOKEN).json()["draining"]
    seen = Counter(
        httpx.post(url + "/v1/chat/completions", json=BODY).headers["x-edgeroute-backend"]
        for _ in range(4)
    )
    assert seen == {"b": 4}
    assert not httpx.post(url + "/admin/backends/a/undrain", headers=TOKEN).json()["draining"]
    assert httpx.delete(url + "/admin/backends/b", headers=TOKEN).status_code == 204
    assert httpx.delete(url + "/admin/backends/b", headers=TOKEN).status_code == 404
    assert httpx.post(url + "/admin/backends/zz/drain", headers=TOKEN).status_code == 404
    seen = Counter(
        httpx.post(url + "/v1/chat/completions", json=BODY).headers["x-edgeroute-backend"]
        for _ in range(3)
    )
    assert seen == {"a": 3}


def test_backend_api_keys_are_never_shown(start_worker: Start, start_gateway: Start) -> None:
    a, _ = start_worker()
    url, _ = start_gateway([])
    r = httpx.post(
        url + "/admin/backends",
        headers=TOKEN,
        json={"url": a, "id": "a", "api_key": "sk-backend-secret"},
    )
    assert r.status_code == 201
    listed = httpx.get(url + "/admin/backends", headers=TOKEN).text
    assert "sk-backend-secret" not in listed


@pytest.mark.parametrize(
    "bad",
    [
        {"url": "ftp://x"},
        {"url": "http://127.0.0.1:1", "role": "nope"},
        {"nope": 1},
        [],
    ],
)
def test_invalid_backends_are_400(start_worker: Start, start_gateway: Start, bad: Any) -> None:
    url, _ = start_gateway([])
    r = httpx.post(url + "/admin/backends", headers=TOKEN, json=bad)
    assert r.status_code == 400 and r.json()["error"]["message"]


def test_routing_changes_at_runtime(start_worker: Start, start_gateway: Start) -> None:
    a, _ = start_worker()
    b, _ = start_worker()
    url, gw = start_gateway([{"url": a, "id": "a"}, {"url": b, "id": "b"}])
    assert httpx.get(url + "/admin/routing", headers=TOKEN).json()["default"]["policy"] == (
        "least_load"
    )
    r = httpx.put(
        url + f"/admin/routing/models/{MODEL}", headers=TOKEN, json={"policy": "session_affinity"}
    )
    assert r.status_code == 200 and r.json()["models"][MODEL]["policy"] == "session_affinity"
    # One session sticks to one backend.
    seen = {
        httpx.post(url + "/v1/chat/completions", json={**BODY, "user": "alice"}).headers[
            "x-edgeroute-backend"
        ]
        for _ in range(8)
    }
    assert len(seen) == 1
    bad = httpx.put(url + "/admin/routing/default", headers=TOKEN, json={"policy": "nope"})
    assert bad.status_code == 400 and "unknown policy" in bad.json()["error"]["message"]
    assert httpx.delete(url + f"/admin/routing/models/{MODEL}", headers=TOKEN).status_code == 204
    assert httpx.delete(url + f"/admin/routing/models/{MODEL}", headers=TOKEN).status_code == 404
    assert gw.pipeline_for(MODEL).name == "least_load"


def test_admin_bodies_are_json_whatever_curl_says_they_are(
    start_worker: Start, start_gateway: Start
) -> None:
    w, _ = start_worker()
    url, _ = start_gateway([w])
    spec = b'{"policy": "round_robin"}'
    # curl -d sends application/x-www-form-urlencoded unless told otherwise.
    for content_type in ({"content-type": "application/x-www-form-urlencoded"}, {}):
        r = httpx.put(
            url + "/admin/routing/default", headers={**TOKEN, **content_type}, content=spec
        )
        assert r.status_code == 200, r.text
    got = httpx.get(url + "/admin/routing", headers=TOKEN).json()
    assert got["default"]["policy"] == "round_robin"
    # A body that is not JSON gets a 400 that names what is expected.
    for body in (b"policy=round_robin", b""):
        r = httpx.put(
            url + "/admin/routing/default",
            headers={**TOKEN, "content-type": "application/x-www-form-urlencoded"},
            content=body,
        )
        assert r.status_code == 400
        assert "application/json" in r.json()["error"]["message"], r.text
    # Another declared type is taken at its word, and refused the same way.
    r = httpx.put(
        url + "/admin/routing/default",
        headers={**TOKEN, "content-type": "text/plain"},
        content=spec,
    )
    assert r.status_code == 400 and "application/json" in r.json()["error"]["message"]
