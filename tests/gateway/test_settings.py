"""Where settings come from, and which source wins (finding 14)."""

from __future__ import annotations

import gc
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from gateway.settings import Settings, load_settings

FILE = """
routing:
  default: {policy: least_load}
  models:
    big: {policy: prefix_cache}
timeouts:
  first_byte: 7
  idle: 9
retries: 4
max_inflight: 100
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    p = tmp_path / "gateway.yaml"
    p.write_text(FILE)
    return p


def test_the_file_alone(config: Path) -> None:
    s = load_settings(config)
    assert s.routing.default.policy == "least_load"
    assert s.routing.models["big"].policy == "prefix_cache"
    assert (s.timeouts.first_byte, s.timeouts.idle, s.retries) == (7, 9, 4)


def test_the_environment_overrides_nested_keys_and_keeps_the_rest(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEROUTE_ROUTING__DEFAULT__POLICY", "cla")
    monkeypatch.setenv("EDGEROUTE_TIMEOUTS__IDLE", "5")
    s = load_settings(config)
    assert s.routing.default.policy == "cla"
    assert s.routing.models["big"].policy == "prefix_cache"  # the file's, kept
    assert s.timeouts.idle == 5 and s.timeouts.first_byte == 7


def test_dotenv_sits_between_the_environment_and_the_file(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("EDGEROUTE_RETRIES=1\nEDGEROUTE_MAX_INFLIGHT=7\n")
    s = load_settings(config, env_file=env_file)
    assert (s.retries, s.max_inflight) == (1, 7)
    monkeypatch.setenv("EDGEROUTE_RETRIES", "3")
    s = load_settings(config, env_file=env_file)
    assert (s.retries, s.max_inflight) == (3, 7)


def test_arguments_win_over_everything(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEROUTE_RETRIES", "3")
    monkeypatch.setenv("EDGEROUTE_TIMEOUTS__IDLE", "5")
    s = load_settings(config, retries=0, timeouts={"idle": 1})
    assert s.retries == 0 and s.timeouts.idle == 1 and s.timeouts.first_byte == 7


def test_the_config_file_from_the_environment(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEROUTE_CONFIG", str(config))
    assert load_settings().retries == 4


def test_defaults_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEROUTE_CONFIG", raising=False)
    s = load_settings()
    assert s.retries == 2 and s.timeouts.first_byte == 30.0


def test_a_missing_or_malformed_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="mapping"):
        load_settings(bad)


def test_warm_ups_that_could_never_run_are_refused() -> None:
    """The warm-ups wait `keep_warm_ms` without a decision and stop `keep_warm_for_ms`
    after the last one: a window shorter than the wait would leave them configured and
    never run."""
    assert Settings(keep_warm_ms=1.0).keep_warm_for_ms == 1000.0
    assert Settings(keep_warm_ms=2000.0, keep_warm_for_ms=5000.0).keep_warm_ms == 2000.0
    with pytest.raises(ValueError, match="shorter than keep_warm_ms"):
        Settings(keep_warm_ms=2000.0)


def test_secrets_stay_out_of_reprs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEROUTE_REDIS_URL", "redis://:hunter2@store:6379/0")
    monkeypatch.setenv("EDGEROUTE_ADMIN_TOKEN", "adm1n")
    s = load_settings()
    assert "hunter2" not in repr(s) and "adm1n" not in repr(s)
    assert s.redis_url is not None and "hunter2" in s.redis_url.get_secret_value()


def test_clients_close_idle_connections_before_the_gateway_does() -> None:
    """A server that closes an idle keep-alive connection as the client sends a request
    on it resets that request; the client's pool (httpx, the openai SDK) must expire
    idle connections first, and so must the gateway's own pool against its workers."""
    import openai._constants

    from gateway.client_protocol import ClientLimits
    from gateway.upstream import UPSTREAM_KEEPALIVE

    gateway = Settings().timeouts.client_keepalive
    clients = [
        httpx.Limits().keepalive_expiry,
        openai._constants.DEFAULT_CONNECTION_LIMITS.keepalive_expiry,
    ]
    assert all(c is not None and c < gateway for c in clients)
    # ... and the gateway, as a client, expires its idle connections to backends before
    # they close them: our workers, and uvicorn's servers (vLLM's) at their default.
    uvicorn_default = inspect.signature(uvicorn.Config).parameters["timeout_keep_alive"].default
    assert min(ClientLimits().keepalive_seconds, uvicorn_default) > UPSTREAM_KEEPALIVE


def test_the_collector_runs_as_the_settings_say_once_the_gateway_is_up(
    start_gateway: Callable[..., tuple[str, Any]],
) -> None:
    """The young generation's threshold is the gateway's setting (Python's 700 walks
    the requests in flight about every seven of them), and what the gateway built at
    start is frozen out of every collection."""
    before = gc.get_threshold()
    try:
        gc.unfreeze()
        url, _ = start_gateway([], gc_young_threshold=12_345)
        assert httpx.get(url + "/healthz").status_code == 200
        assert gc.get_threshold() == (12_345, *before[1:])
        assert gc.get_freeze_count() > 0
    finally:
        gc.set_threshold(*before)
    with pytest.raises(ValueError, match="gc_young_threshold"):
        Settings(gc_young_threshold=10)
