"""Operators feed the NetKV oracle over REST; every replica sees the same state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support import RedisProcess, ServerThread, wait_until

Start = Callable[..., tuple[str, Any]]
TOKEN = {"authorization": "Bearer test-admin-token"}
TOPOLOGY = {
    "instances": {
        "p0": {"node": "n0", "rack": "r0", "pod": "a"},
        "d0": {"node": "n1", "rack": "r0", "pod": "a"},
        "d1": {"node": "n5", "rack": "r5", "pod": "b"},
    },
    "tier_bandwidth": {"node": 3200.0, "rack": 50.0, "pod": 25.0, "cluster": 12.5},
    "tier_latency": {"node": 1.0, "rack": 5.0, "pod": 10.0, "cluster": 20.0},
}


def test_oracle_requires_the_admin_token(start_gateway: Start) -> None:
    url, _ = start_gateway([])
    for method, path in (
        ("GET", ""),
        ("PUT", "/topology"),
        ("PUT", "/congestion"),
        ("POST", "/links"),
        ("GET", "/cost?prefill=a&decode=b"),
        ("GET", "/intents"),
    ):
        r = httpx.request(method, url + "/admin/oracle" + path, json={})
        assert r.status_code == 401, path


def test_push_read_and_query_the_oracle(servers: ServerThread, start_gateway: Start) -> None:
    url, gw = start_gateway([])
    base = url + "/admin/oracle"
    r = httpx.put(base + "/topology", headers=TOKEN, json=TOPOLOGY)
    assert r.status_code == 200, r.text
    r = httpx.put(base + "/congestion", headers=TOKEN, json={"rack": 0.3, "cluster": 0.3})
    assert r.status_code == 200
    state = httpx.get(base, headers=TOKEN).json()
    assert state["congestion"] == {"rack": 0.3, "cluster": 0.3}
    assert state["staleness_tolerance"]["rack>pod"] == pytest.approx(
        (2 * 0.7 - 1.0) / 3
    )  # beta 2, rho_fast 0.3, rho_slow 0
    assert 0 <= state["age_s"] < 5
    cost = httpx.get(
        base + "/cost", headers=TOKEN, params={"prefill": "p0", "decode": "d1", "bytes": 1.25e9}
    ).json()
    assert cost["tier"] == "cluster" and cost["rho"] == 0.3
    assert cost["transfer_s"] == pytest.approx(20e-6 + 1.25e9 / (12.5e9 / 8 * 0.7))
    links = httpx.post(
        base + "/links",
        headers=TOKEN,
        json={
            "links": [
                {"tier": "pod", "utilisation": 0.5, "capacity_gbps": 10},
                {"tier": "pod", "utilisation": 0.1, "capacity_gbps": 30},
            ]
        },
    )
    assert links.json()["congestion"]["pod"] == pytest.approx(0.2)
    oracle = servers.call(lambda: gw.pool.view).oracle
    assert oracle is not None and oracle.congestion["pod"] == 0.2
    metrics = httpx.get(url + "/metrics").text
    wait_until(
        lambda: 'edgeroute_oracle_congestion{tier="pod"} 0.2' in httpx.get(url + "/metrics").text
    )
    assert "edgeroute_oracle_age_seconds" in metrics


@pytest.mark.parametrize(
    "path,body",
    [
        ("/congestion", {"rack": 1.0}),
        ("/congestion", {"rack": -0.1}),
        ("/congestion", {"nope": 0.1}),
        ("/congestion", {"rack": "high"}),
        ("/topology", {"tier_bandwidth": {"rack": -50.0}}),
        ("/topology", {"tier_map": [{"a": "p0", "b": "ghost", "tier": "rack"}]}),
        ("/topology", {"congestion": {"rack": 0.1}}),
        ("/links", {"links": [{"tier": "rack", "utilisation": 1.5}]}),
    ],
)
def test_invalid_updates_are_400_and_leave_the_state_intact(
    start_gateway: Start, path: str, body: dict[str, Any]
) -> None:
    url, _ = start_gateway([])
    base = url + "/admin/oracle"
    assert httpx.put(base + "/topology", headers=TOKEN, json=TOPOLOGY).status_code == 200
    assert httpx.put(base + "/congestion", headers=TOKEN, json={"rack": 0.3}).status_code == 200
    before = httpx.get(base, headers=TOKEN).json()
    method = "POST" if path == "/links" else "PUT"
    r = httpx.request(method, base + path, headers=TOKEN, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]
    after = httpx.get(base, headers=TOKEN).json()
    assert {k: v for k, v in after.items() if k != "age_s"} == {
        k: v for k, v in before.items() if k != "age_s"
    }


def test_nan_congestion_is_rejected(start_gateway: Start) -> None:
    url, _ = start_gateway([])
    r = httpx.put(
        url + "/admin/oracle/congestion",
        headers={**TOKEN, "content-type": "application/json"},
        content=b'{"rack": NaN}',
    )
    assert r.status_code == 400


def test_unknown_instances_in_cost_queries_are_404(start_gateway: Start) -> None:
    url, _ = start_gateway([])
    httpx.put(url + "/admin/oracle/topology", headers=TOKEN, json=TOPOLOGY)
    r = httpx.get(
        url + "/admin/oracle/cost",
        headers=TOKEN,
        params={"prefill": "p0", "decode": "ghost", "tokens": 10},
    )
    assert r.status_code == 404


def test_an_update_on_one_replica_reaches_the_other(
    start_gateway: Start, redis_server: RedisProcess
) -> None:
    url1, _ = start_gateway([], redis_url=redis_server.url, replica_id="r1")
    url2, gw2 = start_gateway([], redis_url=redis_server.url, replica_id="r2")
    assert (
        httpx.put(url1 + "/admin/oracle/topology", headers=TOKEN, json=TOPOLOGY).status_code == 200
    )
    assert (
        httpx.put(
            url1 + "/admin/oracle/congestion", headers=TOKEN, json={"cluster": 0.6}
        ).status_code
        == 200
    )
    wait_until(
        lambda: gw2.oracle is not None and gw2.oracle.topology.congestion.get("cluster") == 0.6,
        timeout=3,
    )
    assert httpx.get(url2 + "/admin/oracle", headers=TOKEN).json()["congestion"] == {"cluster": 0.6}


def test_an_oracle_nobody_has_set_has_no_update_time_or_age(start_gateway: Start) -> None:
    url, _ = start_gateway([])
    state = httpx.get(url + "/admin/oracle", headers=TOKEN).json()
    assert state["updated_at"] is None and state["age_s"] is None
    cost = httpx.get(
        url + "/admin/oracle/cost", headers=TOKEN, params={"prefill": "a", "decode": "b"}
    ).json()
    assert cost["age_s"] is None
    assert "edgeroute_oracle_age_seconds NaN" in httpx.get(url + "/metrics").text
    r = httpx.put(url + "/admin/oracle/congestion", headers=TOKEN, json={"rack": 0.1})
    assert r.status_code == 200
    state = httpx.get(url + "/admin/oracle", headers=TOKEN).json()
    assert state["updated_at"] > 0 and 0 <= state["age_s"] < 5
