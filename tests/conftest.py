"""Fixtures: real servers on loopback (workers, gateways, a Redis-protocol server)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.app import create_app
from tests.support import (
    RedisProcess,
    ServerThread,
    WorkerProcess,
    gateway_settings,
    loopback_socket,
    worker_config,
)
from workers.server import Worker


@pytest.fixture
def servers() -> Iterator[ServerThread]:
    st = ServerThread()
    yield st
    st.close()


@pytest.fixture
def start_worker(servers: ServerThread) -> Callable[..., tuple[str, Worker]]:
    """Start an in-process worker; returns (base url, worker)."""

    def start(**kw: Any) -> tuple[str, Worker]:
        sock = loopback_socket()
        worker = Worker(worker_config(port=sock.getsockname()[1], **kw))
        url, _ = servers.serve(worker.app, sock)
        return url, worker

    return start


@pytest.fixture
def start_gateway(servers: ServerThread) -> Callable[..., tuple[str, Any]]:
    """Start an in-process gateway; returns (base url, Gateway)."""

    def start(backends: list[Any], **kw: Any) -> tuple[str, Any]:
        settings = gateway_settings(backends, **kw)
        app = create_app(settings)
        url, _ = servers.serve(app, settings=settings)
        return url, app.state.gateway

    return start


@pytest.fixture
def redis_server() -> Iterator[RedisProcess]:
    r = RedisProcess()
    r.start()
    yield r
    r.kill()


@pytest.fixture
def worker_process() -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        wp = WorkerProcess(*args)
        started.append(wp)
        return wp

    yield start
    for wp in started:
        wp.kill()
