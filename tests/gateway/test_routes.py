"""The policies in use, kept across config reloads where their spec is unchanged."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.routes import Routes
from gateway.settings import RoutingConfig
from gateway.store import CONFIG_ROUTING
from policies import PipelineSpec, Policy, build_policy
from tests.support import ServerThread, wait_until

Start = Callable[..., tuple[str, Any]]
TOKEN = {"authorization": "Bearer test-admin-token"}
MODEL = "mistral-7b-chat"


def config(**models: str | dict[str, str]) -> RoutingConfig:
    specs = {m: {"policy": p} if isinstance(p, str) else p for m, p in models.items()}
    return RoutingConfig.model_validate({"default": {"policy": "round_robin"}, "models": specs})


def test_an_unchanged_spec_keeps_its_policy_and_a_changed_one_is_rebuilt() -> None:
    routes = Routes(config(a="least_load", b="round_robin"))
    default, a, b = routes.for_model("other"), routes.for_model("a"), routes.for_model("b")
    prefill, decode = routes.prefill, routes.decode
    routes.use(routes.plan(config(a="least_load", b="power_of_two")))
    assert routes.for_model("other") is default and routes.for_model("a") is a
    assert routes.prefill is prefill and routes.decode is decode
    assert routes.for_model("b") is not b and routes.for_model("b").name == "power_of_two"
    # The same spec under another role is that role's own object, not shared.
    assert routes.for_model("b") is not default


def test_a_config_that_fails_to_build_leaves_the_routes_as_they_were() -> None:
    routes = Routes(config(a="least_load"))
    a = routes.for_model("a")
    with pytest.raises(FileNotFoundError, match=r"actor\.onnx"):  # the model files are not there
        routes.use(
            routes.plan(config(a="least_load", b={"policy": "qos_drl", "model": "/nonexistent"}))
        )
    assert routes.for_model("a") is a and routes.for_model("b") is routes.for_model("other")
    routes.use(routes.plan(config(a="least_load")))
    assert routes.for_model("a") is a


def test_adding_a_backend_keeps_the_policies_built(
    start_worker: Start, start_gateway: Start
) -> None:
    """Every config change reloads the whole config on every replica: the policies whose
    spec did not change go on as they were (before, each was built anew)."""
    a, _ = start_worker()
    b, _ = start_worker()
    url, gw = start_gateway([{"url": a, "id": "a"}])
    policy = gw.pipeline_for(MODEL)
    r = httpx.post(url + "/admin/backends", headers=TOKEN, json={"url": b, "id": "b"})
    assert r.status_code in (200, 201), r.text
    assert gw.pipeline_for(MODEL) is policy
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 200
    r = httpx.put(url + "/admin/routing/default", headers=TOKEN, json={"policy": "round_robin"})
    assert r.status_code == 200
    assert gw.pipeline_for(MODEL) is not policy and gw.pipeline_for(MODEL).name == "round_robin"


def test_a_stored_routing_that_cannot_be_built_is_ignored_by_every_replica(
    servers: ServerThread, start_worker: Start, start_gateway: Start
) -> None:
    """The hostile twin of the shared config: a spec that validates but whose policy
    cannot be built (its model files are not on this replica) is written to the store
    behind the admin API's back. The replica keeps its routes and its sync goes on."""
    w, _ = start_worker()
    url, gw = start_gateway([{"url": w, "id": "w"}])
    wait_until(lambda: gw.monitor.config_version != -1)
    version = gw.monitor.config_version
    policy = gw.pipeline_for(MODEL)
    spec = '{"policy": "qos_drl", "model": "/nonexistent"}'
    servers.run(gw.store.put(CONFIG_ROUTING, "*", spec))
    wait_until(lambda: gw.monitor.config_version > version)
    assert gw.pipeline_for(MODEL) is policy and gw.routing.default.policy == "least_load"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 200


def test_a_routing_change_builds_its_policies_off_the_event_loop(
    servers: ServerThread,
    start_worker: Start,
    start_gateway: Start,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Building a learned policy loads its models: done on the loop, every request in
    flight would wait for it, on every replica."""
    w, _ = start_worker()
    url, gw = start_gateway([{"url": w, "id": "w"}])
    threads: list[threading.Thread] = []

    def recorded(spec: PipelineSpec) -> Policy:
        threads.append(threading.current_thread())
        return build_policy(spec)

    # The admin API's check builds it; the routes use what it built, and build nothing.
    monkeypatch.setattr("gateway.app.build_policy", recorded)
    monkeypatch.setattr("gateway.routes.build_policy", recorded)
    r = httpx.put(url + "/admin/routing/default", headers=TOKEN, json={"policy": "round_robin"})
    assert r.status_code == 200 and gw.pipeline_for(MODEL).name == "round_robin"
    assert len(threads) == 1 and servers.thread not in threads
