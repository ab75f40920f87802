"""Schemathesis against the gateway's own OpenAPI schema: the OpenAI API and the admin
API, with and without the admin token. Whatever it generates, the gateway answers with
a documented shape and no internal error: a 5xx can only be 502/503/504 (a backend's
fault, or no capacity), always as an OpenAI error object."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from gateway.app import create_app
from tests.support import ServerThread, gateway_settings, loopback_socket, worker_config
from workers.server import Worker

TOKEN = "test-admin-token"
UPSTREAM_FAULTS = {502, 503, 504}


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    servers = ServerThread()
    sock = loopback_socket()
    worker = Worker(worker_config(port=sock.getsockname()[1], speedup=100.0))
    worker_url, _ = servers.serve(worker.app, sock)
    url, _ = servers.serve(create_app(gateway_settings([{"url": worker_url, "id": "w"}])))
    yield url
    servers.close()


# The schema the gateway serves at /openapi.json (FastAPI builds it without starting).
schema = schemathesis.openapi.from_dict(create_app(gateway_settings([])).openapi())


@schemathesis.check
def no_internal_error(ctx: Any, response: Any, case: Any) -> None:
    if response.status_code >= 500 and response.status_code not in UPSTREAM_FAULTS:
        raise AssertionError(f"{response.status_code} from {case.method} {case.path}")


@schemathesis.check
def errors_are_openai_shaped(ctx: Any, response: Any, case: Any) -> None:
    if response.status_code < 400:
        return
    error = response.json().get("error")
    assert isinstance(error, dict), response.text
    assert isinstance(error.get("message"), str) and error["message"]
    assert isinstance(error.get("type"), str)


CHECKS = [
    no_internal_error,
    errors_are_openai_shaped,
    response_schema_conformance,
    content_type_conformance,
]
FUZZ = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)


@schema.parametrize()
@FUZZ
def test_without_the_admin_token(api: str, case: Any) -> None:
    response = case.call_and_validate(base_url=api, checks=CHECKS, timeout=30)
    if case.path.startswith("/admin"):
        assert response.status_code in (401, 404, 405), response.text


@schema.parametrize()
@FUZZ
def test_with_the_admin_token(api: str, case: Any) -> None:
    token = {"authorization": f"Bearer {TOKEN}"}
    case.call_and_validate(base_url=api, headers=token, checks=CHECKS, timeout=30)
