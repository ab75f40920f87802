"""The emulated worker's HTTP server: vLLM's OpenAI API, `/metrics`, `/health`, `/load`.

A request is validated as vLLM would, its answer decided (real data or the
model's distributions), its text generated deterministically from the seed, and
it then runs through the engine, which paces every token.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hmac
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from gateway.relay import ClientWatch
from oracle.topology import Topology
from policies.odmoe import OdMoEConfig
from policies.text import (
    block_hashes,
    completion_prompts,
    estimate_tokens,
    last_user_text,
    prompt_text,
    stable_hash,
)
from workers.choices import Asked, Choice, Invalid, logprobs, plan, read_asked, tool_calls
from workers.engine import Engine, EngineError, Sequence
from workers.kvtransfer import SharedLink
from workers.metrics import WorkerMetrics
from workers.moe_host import MoEConfig, MoEHost
from workers.odmoe_host import OdMoEHost
from workers.profiles import PROFILES, EngineProfile
from workers.quality import GroundTruth, Outcome

log = logging.getLogger("edgeroute.worker")

WorkerRole = Literal["both", "prefill", "decode"]


class Fault(BaseModel):
    """Misbehaviour on demand, for reliability tests (enabled with `enable_faults`)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["none", "error", "hang", "garbage", "abort"] = "none"
    status: int = Field(default=500, ge=400, le=599)  # for mode "error"
    after_tokens: int = Field(default=2, ge=0)  # for mode "abort": tokens streamed first


class WorkerConfig(BaseModel):
    """One emulated worker."""

    model_config = ConfigDict(extra="forbid")

    profile: str = "mistral-7b-chat"
    served_model_names: list[str] = Field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8100
    speedup: float = Field(default=1.0, gt=0)
    role: WorkerRole = "both"
    instance_id: str | None = None
    topology: Topology | None = None
    data_dir: Path | None = None
    overrides: dict[str, float | int] = Field(default_factory=dict)
    # Prompts not in the data sets answer like this task's prompts. The multiple-choice
    # tasks answer with one letter; free-form chat is closer to code generation.
    default_task: str = "mbpp"
    # Answer as this model of the quality data rather than the profile's own (the
    # profile then sets only the hardware): e.g. one of RouterDC's seven models.
    answers_as: str | None = None
    redis_url: str | None = None  # follow the NetKV oracle's topology in the shared store
    # This instance's own network weather: the mean background utilisation of each
    # tier into it, around which it wanders (never read from the oracle).
    background: dict[str, float] = Field(default_factory=dict)
    background_volatility: float = Field(default=0.5, ge=0)
    seed: int = 0
    moe: MoEConfig | None = None  # MoE worker mode: the experts it hosts
    odmoe: OdMoEConfig | None = None  # OD-MoE mode: experts loaded on demand
    # Required as a bearer token by /admin/*, which is closed without one (the
    # gateway's Prism scheduler sends it from the backend's `moe.admin_token`).
    admin_token: SecretStr | None = None
    enable_faults: bool = False
    fault: Fault = Field(default_factory=Fault)

    def engine_profile(self) -> EngineProfile:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; known: {sorted(PROFILES)}")
        return PROFILES[self.profile].with_overrides(**self.overrides)

    @property
    def names(self) -> list[str]:
        return self.served_model_names or [self.profile]

    @property
    def id(self) -> str:
        return self.instance_id or f"{self.host}:{self.port}"


def _task(request: Request, body: dict[str, Any]) -> str | None:
    """The request's class: the gateway's `x-edgeroute-task` header, else the body's
    `metadata.task` (OpenAI's free-form metadata), which routers that drop unknown
    headers still forward."""
    header = request.headers.get("x-edgeroute-task")
    if header:
        return header
    meta = body.get("metadata")
    task = meta.get("task") if isinstance(meta, dict) else None
    return task if isinstance(task, str) and task else None


def _error(status: int, message: str, param: str | None = None) -> Response:
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}.get(
        status, "InternalServerError"
    )
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _admin_denied(request: Request, token: SecretStr | None) -> Response | None:
    """None when the request carries the worker's admin token; without a token set
    (or a blank one) the admin API is closed to everyone."""
    expected = token.get_secret_value().strip() if token is not None else ""
    if not expected:
        return _error(401, "this worker's admin API is closed: start it with --admin-token")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), expected.encode()
    ):
        return None
    return _error(401, "a valid admin token is required (Authorization: Bearer ...)")


class _Invalid(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def _int_field(body: dict[str, Any], name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _Invalid(f"'{name}' must be an integer >= {low}", name)
    return value


def _texts(body: dict[str, Any], name: str) -> list[str]:
    """A completion's `prompt` or an embedding's `input` as texts (`completion_prompts`),
    or a 400 naming the field."""
    texts = completion_prompts(body.get(name))
    if texts is None:
        raise _Invalid(
            f"'{name}' must be a string, a list of strings or of token ids, "
            "or a list of lists of token ids",
            name,
        )
    return texts


def _stop_list(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise _Invalid("'stop' must be a string or a list of strings", "stop")


class Worker:
    """One emulated vLLM server: engine, ground truth, metrics and its ASGI app."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.profile = config.engine_profile()
        self.moe = (
            MoEHost(config.moe, config.data_dir or Path("."), config.speedup)
            if config.moe is not None
            else None
        )
        if config.moe is not None and config.odmoe is not None:
            raise ValueError("a worker runs either the moe or the odmoe mode, not both")
        self.odmoe = OdMoEHost(config.odmoe) if config.odmoe is not None else None
        extra = self.moe or self.odmoe
        self.engine = Engine(
            self.profile,
            speedup=config.speedup,
            extra_cost=extra.iteration_cost if extra is not None else None,
        )
        self.metrics = WorkerMetrics(self.engine, config.names[0], self.network_counters)
        self.engine.observers.append(self.metrics.observe)
        data_model = config.answers_as or PROFILES[config.profile].data_model
        self.truth = GroundTruth(data_model, config.data_dir) if data_model else None
        self.links: dict[str, SharedLink] = {}
        self.started = int(time.time())
        self.app = self._build_app()

    # -- answers -------------------------------------------------------------

    def _outcome(self, prompt: str, task: str | None, seed: int) -> Outcome:
        """The answer to `prompt` (the last user message, or one completion prompt)."""
        if self.truth is None:
            return Outcome(tokens=16, score=0.0, task="none", source="fixed")
        return self.truth.outcome(prompt, task, seed)

    def _tier_capacity(self, tier: str) -> float:
        """Bytes/s into this instance on `tier`, read at every change: congestion is live."""
        topo = self.config.topology
        return topo.effective_bandwidth(tier) if topo is not None else float("inf")

    async def _receive_kv(self, params: dict[str, Any], seq: Sequence) -> None:
        """Wait for the prefill instance's KV cache to arrive over the emulated network.

        Only the blocks this instance's prefix cache lacks travel.
        """
        topo = self.config.topology
        source = str(params.get("remote_engine_id") or "")
        if topo is None or not source:
            return
        tier = topo.tier(source, self.config.id)
        link = self.links.get(tier)
        if link is None:
            link = SharedLink(functools.partial(self._tier_capacity, tier), self.config.speedup)
            self.links[tier] = link
        hit, _ = self.engine.cached_prefix(seq)
        nbytes = max(0, seq.prompt_tokens - hit) * self.profile.kv_bytes_per_token
        latency = topo.tier_latency.get(tier, 0.0) * 1e-6
        await asyncio.sleep(latency / self.config.speedup)
        # the emulated time, as the link's clock has it: a late host changes none of it
        self.metrics.xfer_time.observe(latency + await link.send(nbytes))
        self.metrics.xfer_bytes.observe(nbytes)

    async def wander_background(self, step: float = 0.5) -> None:
        """Move each tier's background around its mean (an Ornstein-Uhlenbeck walk in
        emulated time), in this worker's own topology; the links re-read it at once."""
        rng = random.Random(self.config.seed)
        means = self.config.background
        level = dict(means)
        sigma = self.config.background_volatility * step**0.5
        while True:
            topo = self.config.topology
            if topo is not None:
                self.config.topology = topo.model_copy(update={"congestion": dict(level)})
                for link in self.links.values():
                    link.refresh()
            await asyncio.sleep(step / self.config.speedup)
            for tier, mean in means.items():
                b = level[tier] + (mean - level[tier]) * min(1.0, step)
                level[tier] = min(0.95, max(0.0, b + sigma * mean * rng.gauss(0.0, 1.0)))

    def network_counters(self) -> dict[str, tuple[float, float]]:
        """Per tier into this instance: (background utilisation now, emulated seconds
        the link has been busy with transfers)."""
        topo = self.config.topology
        if topo is None:
            return {}
        tiers = set(self.config.background) | set(self.links)
        return {
            tier: (
                topo.congestion.get(tier, 0.0),
                self.links[tier].busy_seconds if tier in self.links else 0.0,
            )
            for tier in sorted(tiers)
        }

    async def follow_oracle(self, every: float = 1.0) -> None:
        """Keep the emulated network on the topology operators push into the oracle."""
        import redis.asyncio as aioredis
        from redis.exceptions import RedisError

        from gateway.store import CONFIG_ORACLE, ORACLE_FIELD
        from oracle.state import OracleState

        assert self.config.redis_url is not None
        client = aioredis.Redis.from_url(
            self.config.redis_url, socket_timeout=1.0, socket_connect_timeout=1.0
        )
        try:
            while True:
                try:
                    raw = await client.hget(CONFIG_ORACLE, ORACLE_FIELD)
                    if raw:
                        self.config.topology = OracleState.model_validate_json(raw).topology
                except (RedisError, OSError, ValueError) as exc:
                    log.debug("oracle not readable: %s", exc)
                await asyncio.sleep(every)
        finally:
            await client.aclose()

    # -- the OpenAI endpoints --------------------------------------------------

    async def _serve(
        self,
        request: Request,
        run: Callable[[Request, dict[str, Any]], Awaitable[Response]],
    ) -> Response:
        """An OpenAI request: its body read, the faults asked for acted out, then `run`."""
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"invalid JSON body: {exc}")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        fault = self.config.fault
        if fault.mode == "error":
            return _error(fault.status, "injected fault")
        if fault.mode == "hang":
            while not await request.is_disconnected():
                await asyncio.sleep(0.05)
            return Response(status_code=499)
        if fault.mode == "garbage":
            return Response(b"\x00not json{{{", media_type="application/json")
        try:
            return await run(request, body)
        except _Invalid as exc:
            return _error(exc.status, str(exc), exc.param)

    def _submit(self, seqs: list[Sequence], param: str) -> None:
        """All of `seqs` to the engine, or none: a 400 naming `param` if one can never
        run (it would not fit in memory)."""
        try:
            for seq in seqs:
                self.engine.submit(seq)
        except EngineError as exc:
            for seq in seqs:
                self.engine.cancel(seq)
            raise _Invalid(str(exc), param) from exc

    async def _done(self, request: Request, running: list[Sequence]) -> Response | None:
        """Wait until the engine has finished `running`; a 499 if the client left first
        (its sequences cancelled), a 500 if one failed, else None."""
        watch = ClientWatch()
        watch.start(request.scope, request.receive)
        try:
            for seq in running:
                while (await seq.tokens.get()) is not None:
                    pass
        except asyncio.CancelledError:
            if not watch.client_left():
                raise
            for seq in running:
                self.engine.cancel(seq)
            return Response(status_code=499)
        finally:
            watch.finish()
        failed = next((seq.error for seq in running if seq.error), None)
        return _error(500, failed) if failed else None

    async def _embed(self, request: Request, body: dict[str, Any]) -> Response:
        """vLLM's /v1/embeddings for a pooling model: each input's prefill runs through
        the engine (one pass, no decode), and its vector is drawn from its text, unit
        length, so equal inputs embed alike."""
        model = body.get("model")
        if model not in self.config.names:
            raise _Invalid(f"The model `{model}` does not exist.", "model", 404)
        texts = _texts(body, "input")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise _Invalid("'encoding_format' must be float or base64", "encoding_format")
        dims = _int_field(body, "dimensions", 1) or EMBEDDING_DIMENSIONS
        if dims > EMBEDDING_DIMENSIONS:
            raise _Invalid(
                f"'dimensions' must be at most {EMBEDDING_DIMENSIONS} for this model",
                "dimensions",
            )
        sizes = [estimate_tokens(text) for text in texts]
        limit = self.profile.max_model_len
        if (longest := max(sizes)) > limit:
            raise _Invalid(
                f"This model's maximum context length is {limit} tokens; an input has {longest}.",
                "input",
            )
        given = request.headers.get("x-request-id")
        rid = "embd-" + (given or uuid.uuid4().hex)
        seqs = [
            Sequence(
                id=f"{rid}-{i}",
                prompt_tokens=size,
                target_tokens=1,  # the pooled output, at the end of the prefill
                prefix_hashes=block_hashes(text, self.profile.block_size),
            )
            for i, (text, size) in enumerate(zip(texts, sizes, strict=True))
        ]
        self._submit(seqs, "input")
        if (stopped := await self._done(request, seqs)) is not None:
            return stopped
        data = [
            {
                "index": i,
                "object": "embedding",
                "embedding": _embedding(text, str(model), dims, fmt),
            }
            for i, text in enumerate(texts)
        ]
        tokens = sum(sizes)
        out = {
            "id": rid,
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        headers = {"x-emulated-backend": self.config.id}
        return Response(orjson.dumps(out), media_type="application/json", headers=headers)

    async def _complete(self, request: Request, body: dict[str, Any], chat: bool) -> Response:
        model = body.get("model")
        if model not in self.config.names:
            raise _Invalid(f"The model `{model}` does not exist.", "model", 404)
        if chat and not isinstance(body.get("messages"), list):
            raise _Invalid("'messages' must be a list", "messages")
        # a completion may carry a batch of prompts: n choices each, in their order
        prompts = [prompt_text(body)] if chat else _texts(body, "prompt")
        try:
            asked = read_asked(body, chat)
        except Invalid as exc:
            raise _Invalid(str(exc), exc.param) from exc
        max_tokens = _int_field(body, "max_completion_tokens", 1) or _int_field(
            body, "max_tokens", 1
        )
        stop = _stop_list(body)
        seed_field = _int_field(body, "seed", -(2**63))
        stream = bool(body.get("stream", False))
        usage_in_stream = bool((body.get("stream_options") or {}).get("include_usage"))
        sizes = [estimate_tokens(text) for text in prompts]
        limit = self.profile.max_model_len
        for prompt_tokens in sizes:
            if prompt_tokens >= limit:
                raise _Invalid(
                    f"This model's maximum context length is {limit} tokens; "
                    f"the prompt has {prompt_tokens}.",
                    "messages" if chat else "prompt",
                )
            if max_tokens is not None and prompt_tokens + max_tokens > limit:
                raise _Invalid(
                    f"This model's maximum context length is {limit} tokens. You requested "
                    f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
                    f"{max_tokens} in the completion).",
                    "max_tokens",
                )

        task = _task(request, body) or self.config.default_task
        choices: list[Choice] = []
        of_choice: list[int] = []  # each choice's prompt
        outcomes = []
        for i, (text, prompt_tokens) in enumerate(zip(prompts, sizes, strict=True)):
            # a given seed goes on from prompt to prompt as from choice to choice, so a
            # batch's prompts differ as a model's answers to them would
            if seed_field is None:
                seed = stable_hash(text + str(model))
            else:
                seed = seed_field + i * asked.n
            outcome = self._outcome(last_user_text(body) if chat else text, task, seed)
            room = limit - prompt_tokens
            for c in plan(asked, seed, outcome.tokens, min(max_tokens or room, room), stop):
                c.index += i * asked.n
                choices.append(c)
                of_choice.append(i)
            outcomes.append(outcome)
        outcome = outcomes[0]  # a batch's headers name its first prompt's answer

        kv_params = body.get("kv_transfer_params") or {}
        if not isinstance(kv_params, dict):
            raise _Invalid("'kv_transfer_params' must be an object", "kv_transfer_params")
        remote_decode = bool(kv_params.get("do_remote_decode"))
        remote_prefill = bool(kv_params.get("do_remote_prefill"))
        if remote_decode:
            for c in choices:
                c.pieces, c.finish = c.pieces[:1], "length"

        # vLLM names the response after the caller's X-Request-Id when there is one.
        given = request.headers.get("x-request-id")
        rid = ("chatcmpl-" if chat else "cmpl-") + (given or uuid.uuid4().hex)
        hashes = [block_hashes(text, self.profile.block_size) for text in prompts]
        seqs = [
            Sequence(
                id=f"{rid}-{uuid.uuid4().hex[:8]}" if given or c.index else rid,
                prompt_tokens=sizes[i],
                target_tokens=max(len(c.pieces), 1) if remote_decode else len(c.pieces),
                prefix_hashes=hashes[i],
                task=_task(request, body) or "",
            )
            for c, i in zip(choices, of_choice, strict=True)
        ]
        headers = {
            "x-emulated-score": f"{outcome.score:g}",
            "x-emulated-task": outcome.task,
            "x-emulated-source": outcome.source,
            "x-emulated-backend": self.config.id,
        }
        if remote_prefill:
            await self._receive_kv(kv_params, seqs[0])
            for seq in seqs:
                seq.remote_cached_tokens = seq.prompt_tokens
        out_params = None
        if remote_decode:
            out_params = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": self.config.id,
                "remote_block_ids": list(range(self.profile.blocks_for(sizes[0]))),
                "remote_host": self.config.host,
                "remote_port": self.config.port,
                "tp_size": 1,
            }
        answer = _Answer(rid, str(model), chat, asked, choices, sum(sizes))
        running = [seq for seq in seqs if seq.target_tokens > 0]
        self._submit(running, "max_tokens")
        if stream:
            return StreamingResponse(
                self._stream(answer, seqs, usage_in_stream),
                media_type="text/event-stream",
                headers=headers,
            )

        if (stopped := await self._done(request, running)) is not None:
            return stopped
        body_out = answer.whole([seq.generated for seq in seqs], out_params)
        return Response(orjson.dumps(body_out), media_type="application/json", headers=headers)

    async def _stream(
        self, answer: _Answer, seqs: list[Sequence], include_usage: bool
    ) -> AsyncIterator[bytes]:
        # The choices advance in one batch, so taking their tokens in turn interleaves
        # them as vLLM's stream does; a choice that is ahead waits in its queue.
        try:
            live = [(c, seq) for c, seq in zip(answer.choices, seqs, strict=True)]
            abort_after = (
                self.config.fault.after_tokens if self.config.fault.mode == "abort" else -1
            )
            sent = 0
            while live:
                for c, seq in list(live):
                    index = await seq.tokens.get() if seq.target_tokens > 0 else None
                    if index is None:
                        live.remove((c, seq))
                        if not c.pieces:
                            yield answer.event(c, 0, 0)
                        continue
                    if sent == abort_after:
                        raise ConnectionAbortedError("injected mid-stream abort")
                    sent += 1
                    yield answer.event(c, index - 1, index)
            failed = next((seq.error for seq in seqs if seq.error), None)
            if failed:
                err = {
                    "error": {
                        "message": failed,
                        "type": "InternalServerError",
                        "param": None,
                        "code": 500,
                    }
                }
                yield b"data: " + orjson.dumps(err) + b"\n\n"
                return
            if include_usage:
                yield answer.usage_event(sum(seq.generated for seq in seqs))
            yield b"data: [DONE]\n\n"
        finally:
            for seq in seqs:
                if not seq.finished:
                    self.engine.cancel(seq)

    # -- the app ---------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        worker = self

        async def log_stats(every: float = 10.0) -> None:
            # Like vLLM's periodic line: throughput and queues, while there is work.
            st = worker.engine.stats
            last = (st.prompt_tokens, st.generation_tokens, st.finished)
            while True:
                await asyncio.sleep(every)
                now = (st.prompt_tokens, st.generation_tokens, st.finished)
                e = worker.engine
                if now != last or e.running or e.waiting:
                    log.info(
                        "%s: prompt %.1f tok/s, generation %.1f tok/s, %d finished, "
                        "running %d, waiting %d, KV %.1f%%, preemptions %d",
                        worker.config.id,
                        (now[0] - last[0]) / every,
                        (now[1] - last[1]) / every,
                        now[2] - last[2],
                        len(e.running),
                        len(e.waiting),
                        e.kv_usage * 100,
                        st.preemptions,
                    )
                last = now

        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            stats_task = asyncio.create_task(log_stats())
            oracle_task = (
                asyncio.create_task(worker.follow_oracle()) if worker.config.redis_url else None
            )
            weather = (
                asyncio.create_task(worker.wander_background())
                if worker.config.background
                else None
            )
            worker.engine.start()
            log.info(
                "worker %s (%s, role %s, speedup %g) ready",
                worker.config.id,
                worker.config.profile,
                worker.config.role,
                worker.config.speedup,
            )
            yield
            stats_task.cancel()
            for task in (oracle_task, weather):
                if task is not None:
                    task.cancel()
            await worker.engine.stop()
            log.info("worker %s stopped", worker.config.id)

        app = FastAPI(
            title=f"edgeroute worker ({self.config.profile})",
            docs_url=None,
            redoc_url=None,
            lifespan=lifespan,
        )

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await worker._serve(request, functools.partial(worker._complete, chat=True))

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return await worker._serve(request, functools.partial(worker._complete, chat=False))

        @app.post("/v1/embeddings")
        async def embeddings(request: Request) -> Response:
            return await worker._serve(request, worker._embed)

        @app.get("/v1/models")
        async def models() -> Response:
            data = [
                {
                    "id": name,
                    "object": "model",
                    "created": worker.started,
                    "owned_by": "edgeroute",
                    "root": worker.config.profile,
                    "max_model_len": worker.profile.max_model_len,
                }
                for name in worker.config.names
            ]
            return Response(
                orjson.dumps({"object": "list", "data": data}), media_type="application/json"
            )

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

        @app.get("/load")
        async def load() -> Response:
            e = worker.engine
            return Response(
                orjson.dumps({"server_load": len(e.running) + len(e.waiting)}),
                media_type="application/json",
            )

        if worker.moe is not None:
            moe = worker.moe

            @app.get("/moe/stats")
            async def moe_stats() -> Response:
                return Response(orjson.dumps(moe.report()), media_type="application/json")

            @app.put("/admin/placement")
            async def placement(
                request: Request, body: dict[str, list[tuple[int, int]]]
            ) -> Response:
                if denied := _admin_denied(request, worker.config.admin_token):
                    return denied
                seconds = await moe.apply(body.get("hosted", []))
                return Response(
                    orjson.dumps({"applied": True, "transfer_s": seconds}),
                    media_type="application/json",
                )

        if worker.odmoe is not None:
            odmoe = worker.odmoe

            @app.get("/odmoe/stats")
            async def odmoe_stats() -> Response:
                return Response(orjson.dumps(odmoe.report()), media_type="application/json")

        if worker.config.enable_faults:

            @app.post("/admin/fault")
            async def set_fault(request: Request, fault: Fault) -> Response:
                if denied := _admin_denied(request, worker.config.admin_token):
                    return denied
                worker.config.fault = fault
                return Response(fault.model_dump_json(), media_type="application/json")

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(
                worker.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
            )

        return app


EMBEDDING_DIMENSIONS = 256  # of the emulated pooling model's vectors


def _embedding(text: str, model: str, dims: int, fmt: str) -> list[float] | str:
    """`text`'s vector: drawn from its hash, cut to `dims` and scaled to unit length
    (as a Matryoshka model's shortened vectors are), as floats or as base64 of its
    little-endian float32s (what OpenAI's `base64` format carries)."""
    rng = np.random.default_rng(stable_hash(model + "\x00" + text))
    v = rng.standard_normal(EMBEDDING_DIMENSIONS)[:dims]
    v = (v / np.linalg.norm(v)).astype("<f4")
    return base64.b64encode(v.tobytes()).decode("ascii") if fmt == "base64" else v.tolist()


class _Answer:
    """One request's answer in OpenAI's shapes: whole, or as stream events."""

    def __init__(
        self,
        rid: str,
        model: str,
        chat: bool,
        asked: Asked,
        choices: list[Choice],
        prompt_tokens: int,
    ) -> None:
        self.rid = rid
        self.model = model
        self.chat = chat
        self.asked = asked
        self.choices = choices
        self.prompt_tokens = prompt_tokens
        self.created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        self._head = orjson.dumps(
            {"id": rid, "object": kind, "created": self.created, "model": model}
        )[:-1]

    def _usage(self, completion: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def _logprobs(self, c: Choice, start: int, end: int) -> dict[str, Any] | None:
        k = self.asked.logprobs
        return None if k is None else logprobs(c, start, end, k, self.chat)

    def whole(self, generated: list[int], kv_params: dict[str, Any] | None) -> dict[str, Any]:
        out = []
        for c, n in zip(self.choices, generated, strict=True):
            text = "".join(c.pieces[:n])
            finish = c.finish if n >= len(c.pieces) else "length"
            if not self.chat:
                out.append(
                    {
                        "index": c.index,
                        "text": text,
                        "logprobs": self._logprobs(c, 0, n),
                        "finish_reason": finish,
                    }
                )
                continue
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if c.tool_call_id is not None:
                message = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": tool_calls(self.asked, c, text),
                }
            out.append(
                {
                    "index": c.index,
                    "message": message,
                    "logprobs": self._logprobs(c, 0, n),
                    "finish_reason": finish,
                }
            )
        return {
            "id": self.rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": out,
            "usage": self._usage(sum(generated)),
            "kv_transfer_params": kv_params,
        }

    def event(self, c: Choice, start: int, end: int) -> bytes:
        """The event carrying tokens `start` to `end` of `c` (none: its end). vLLM sends
        a chat choice's role with its first token, and a tool call's name and id first."""
        delta_text = "".join(c.pieces[start:end])
        last = end >= len(c.pieces)
        reason = c.finish if last else None
        if not self.chat:
            choice = {
                "index": c.index,
                "text": delta_text,
                "logprobs": self._logprobs(c, start, end),
                "finish_reason": reason,
            }
            return self._event([choice])
        events = []
        if start == 0:
            head: dict[str, Any] = {"role": "assistant", "content": ""}
            if c.tool_call_id is not None:
                call = tool_calls(self.asked, c, "")
                head = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"index": 0, **call[0]}],
                }
            events.append(
                self._event(
                    [{"index": c.index, "delta": head, "logprobs": None, "finish_reason": None}]
                )
            )
        if c.tool_call_id is not None:
            delta: dict[str, Any] = {
                "tool_calls": [{"index": 0, "function": {"arguments": delta_text}}]
            }
        else:
            delta = {"content": delta_text}
        choice = {
            "index": c.index,
            "delta": delta,
            "logprobs": self._logprobs(c, start, end),
            "finish_reason": reason,
        }
        events.append(self._event([choice]))
        return b"".join(events)

    def _event(self, choices: list[dict[str, Any]]) -> bytes:
        return b"data: " + self._head + b',"choices":' + orjson.dumps(choices) + b"}\n\n"

    def usage_event(self, completion: int) -> bytes:
        usage = orjson.dumps(self._usage(completion))
        return b"data: " + self._head + b',"choices":[],"usage":' + usage + b"}\n\n"
