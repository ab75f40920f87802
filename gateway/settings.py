"""Typed settings, from pydantic-settings' own sources, each overriding the one after it:

1. arguments (`load_settings(**overrides)`, the CLI's flags);
2. `EDGEROUTE_*` environment variables;
3. a dotenv file, when one is named;
4. the YAML file (`--config` or `EDGEROUTE_CONFIG`);
5. the defaults here.

Nested keys merge across sources: `EDGEROUTE_ROUTING__DEFAULT__POLICY=cla` changes the
default policy and keeps the file's per-model routing; `EDGEROUTE_TIMEOUTS__IDLE=5`
keeps the file's other timeouts.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from gateway.upstream import Target
from oracle.topology import Topology
from policies import PipelineSpec
from policies.odmoe import OdMoEConfig
from policies.registry import PluginRef
from policies.types import Role


class CostProfile(BaseModel):
    """What the decode cost model needs to know of a backend's engine (NetKV)."""

    model_config = ConfigDict(extra="forbid")

    kv_bytes_per_token: float = Field(default=327_680.0, gt=0)  # per shard under TP
    iter_base: float = Field(default=0.02, ge=0)  # s per iteration ...
    iter_per_seq: float = Field(default=0.0005, ge=0)  # ... plus this per batched sequence
    max_batch: int = Field(default=256, ge=1)


class MoEBackend(BaseModel):
    """A MoE backend's hardware, for Prism's placement (memory per GPU, I/O speed)."""

    model_config = ConfigDict(extra="forbid")

    gpu_memory_gb: list[float] = Field(min_length=1)
    io_gbps: list[float] = Field(default_factory=lambda: [2.0])
    expert_gb: float = Field(default=0.35, gt=0)
    admin_token: SecretStr | None = None  # the worker's, for pushing placements
    # What one remote expert call costs this backend over a local one, in seconds: the
    # round trip, the activations over the link and the remote load (the emulated
    # worker's defaults: 1 ms + 2 x 8 KB at 500 Mbps + 2 ms).
    remote_call_s: float = Field(default=0.00326, gt=0)


class BackendConfig(BaseModel):
    """A backend named in the config file or added over the admin API."""

    model_config = ConfigDict(extra="forbid")

    url: str
    id: str | None = None
    role: Role = "both"
    models: list[str] = Field(default_factory=list)  # empty: discovered from /v1/models
    api_key: SecretStr | None = None
    draining: bool = False
    # The backend names its answer after the X-Request-Id it was sent (vLLM does:
    # `chatcmpl-<id>`); the gateway then refuses an answer named otherwise.
    echoes_request_id: bool = False
    # The model the QoS predictor reads this backend as (a name in its list, e.g.
    # "meta-llama/Meta-Llama-3-8B"), where the names it serves say otherwise (an
    # Instruct build, an alias); unset: matched by its served names.
    predicted_as: str | None = None
    profile: CostProfile = Field(default_factory=CostProfile)
    moe: MoEBackend | None = None  # Prism places this backend's experts
    odmoe: OdMoEConfig | None = None  # an OD-MoE backend: its pipeline, for eq. 1

    @cached_property
    def target(self) -> Target:
        """Where the proxy path connects."""
        return Target.parse(self.url)

    def authorization(self) -> str | None:
        """The `authorization` header the gateway sends this backend (its api_key)."""
        if self.api_key is None:
            return None
        return f"Bearer {self.api_key.get_secret_value()}"

    @cached_property
    def iter_base(self) -> float:
        """Seconds per decode iteration; an OD-MoE backend's come from its pipeline."""
        if self.odmoe is not None:
            return self.odmoe.expected_token_seconds()
        return self.profile.iter_base

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        v = v.rstrip("/")
        if not v.startswith(("http://", "https://")) or len(v) < 10:
            raise ValueError("url must be an http:// or https:// URL")
        if "@" in urlsplit(v).netloc:
            raise ValueError("url must not carry credentials; give the backend an api_key")
        return v

    @property
    def backend_id(self) -> str:
        return self.id or self.url.split("://", 1)[1]


def _prefill_spec() -> PipelineSpec:
    return PipelineSpec(policy="least_load", filters=["prefill_role", "serves_model", "healthy"])


def _decode_spec() -> PipelineSpec:
    return PipelineSpec(policy="netkv_full")


class RoutingConfig(BaseModel):
    """Whole requests by `default` (or a per-model spec); disaggregated ones by `prefill`
    then `decode`."""

    model_config = ConfigDict(extra="forbid")

    default: PipelineSpec = Field(default_factory=PipelineSpec)
    models: dict[str, PipelineSpec] = Field(default_factory=dict)
    prefill: PipelineSpec = Field(default_factory=_prefill_spec)
    decode: PipelineSpec = Field(default_factory=_decode_spec)

    # Keys of the shared store's routing hash; a model name never starts with "*".
    ROLES: ClassVar[dict[str, str]] = {"*": "default", "*prefill": "prefill", "*decode": "decode"}

    def spec_for(self, model: str) -> PipelineSpec:
        return self.models.get(model, self.default)

    def to_store(self) -> dict[str, str]:
        out = {m: s.model_dump_json(exclude_none=True) for m, s in self.models.items()}
        for key, role in self.ROLES.items():
            out[key] = getattr(self, role).model_dump_json(exclude_none=True)
        return out

    @classmethod
    def from_store(cls, entries: dict[str, Any]) -> RoutingConfig:
        roles = {
            role: PipelineSpec.model_validate(entries[key])
            for key, role in cls.ROLES.items()
            if key in entries
        }
        models = {
            m: PipelineSpec.model_validate(v) for m, v in entries.items() if m not in cls.ROLES
        }
        return cls(models=models, **roles)


class Timeouts(BaseModel):
    """Seconds. Why these defaults: see the README's Reliability section."""

    model_config = ConfigDict(extra="forbid")

    connect: float = Field(default=2.0, gt=0)
    # A stream's first event: its time to first token, queueing included.
    first_byte: float = Field(default=30.0, gt=0)
    # A request that is not streamed: its whole answer, which comes at once.
    response: float = Field(default=300.0, gt=0)
    idle: float = Field(default=30.0, gt=0)  # between two chunks of a stream
    # A backend holding requests that has sent no byte and generated no token for
    # this long while they wait is stalled: they go elsewhere, its circuit opens.
    stall: float = Field(default=10.0, gt=0)
    scrape: float = Field(default=1.0, gt=0)
    # Clients: the whole request head must arrive within `client_header` of its first
    # byte (and of the connection's opening); an idle keep-alive connection closes
    # after `client_keepalive`. It outlasts clients' own idle expiry (httpx and the
    # openai SDK: 5 s), so that the client, which knows when it will send, closes idle
    # connections: a server closing one as a request goes out on it resets the request.
    client_header: float = Field(default=10.0, gt=0)
    client_keepalive: float = Field(default=75.0, gt=0)


class Limits(BaseModel):
    """Sizes accepted from clients (requests) and from backends (responses)."""

    model_config = ConfigDict(extra="forbid")

    request_headers: int = Field(default=100, ge=8)  # header lines
    request_header_bytes: int = Field(default=32 * 1024, ge=1024)  # request line included
    response_headers: int = Field(default=100, ge=8)
    response_header_bytes: int = Field(default=64 * 1024, ge=1024)
    response_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)  # not streamed


class CircuitConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    failures: int = Field(default=3, ge=1)  # consecutive failures that open it
    open_seconds: float = Field(default=5.0, gt=0)  # before a probe may close it


class Settings(BaseSettings):
    """Everything the gateway reads at start-up."""

    model_config = SettingsConfigDict(
        env_prefix="EDGEROUTE_", env_nested_delimiter="__", extra="forbid"
    )

    host: str = "127.0.0.1"
    port: int = 8000
    backends: list[BackendConfig] = Field(default_factory=list)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    # Request hooks from installed packages (entry-point group `edgeroute.hooks`).
    hooks: list[PluginRef] = Field(default_factory=list)
    oracle: Topology | None = None  # the NetKV oracle's initial topology
    prism_replan_seconds: float = Field(default=300.0, gt=0)  # Prism's re-planning period
    # None: start an embedded Valkey server (with a generated password). A password
    # goes in the URL: redis://:secret@host:6379/0.
    redis_url: SecretStr | None = None
    # None, empty or blank: the admin API answers 401 to everyone.
    admin_token: SecretStr | None = None
    api_keys: list[SecretStr] = Field(default_factory=list)  # empty: no client keys needed
    # Pass the client's Authorization and Cookie headers on to the backend? Only
    # without api_keys (then the Authorization is the gateway's key, never forwarded).
    forward_client_credentials: bool = False
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    limits: Limits = Field(default_factory=Limits)
    max_inflight: int = Field(default=4096, ge=0)  # per replica; 0 means unlimited
    retries: int = Field(default=2, ge=0)  # other backends tried before the first byte
    retry_after: float = Field(default=1.0, gt=0)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    circuit: CircuitConfig = Field(default_factory=CircuitConfig)
    scrape_interval: float = Field(default=1.0, gt=0)
    health_interval: float = Field(default=2.0, gt=0)
    stale_after: float = Field(default=5.0, gt=0)  # engine stats older than this do not steer
    sync_interval: float = Field(default=0.2, gt=0)  # shared-store refresh period
    replica_ttl: float = Field(default=10.0, gt=0)
    replica_id: str | None = None
    prefix_block_tokens: int = Field(default=64, ge=1)
    prefix_cache_entries: int = Field(default=20000, ge=1)  # block hashes kept per backend
    log_level: str = "INFO"
    json_logs: bool = True
    # Measured in `edgeroute bench overhead --variants`; the defaults are the faster.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    # Gateway processes on the port, each a replica sharing the store (one core each).
    processes: int = Field(default=1, ge=1, le=64)
    http_parser: Literal["httptools", "h11"] = "httptools"
    # Container objects allocated (net) between two young-generation collections.
    # Python's 700 suits short scripts; a gateway keeps tens of thousands alive in
    # flight, and every collection walks them: see docs/performance.md
    # ("The decision as one graph, and the collector").
    gc_young_threshold: int = Field(default=10_000, ge=100)
    # Milliseconds: when the gateway has decided nothing for this long, it repeats the
    # last decision of each policy that can (`policies.Warmable`: qos_drl), so that the
    # next one finds the core awake and its graph in the caches; 0 turns it off. It
    # costs one decision per period while idle: see docs/performance.md ("Keeping the
    # decision warm").
    keep_warm_ms: float = Field(default=0.0, ge=0)
    # Milliseconds after the last decision during which the warm-ups go on: between the
    # bursts of a busy gateway, not through a quiet night (at 1 ms they cost 11% of a
    # core while idle; past the window the loop sleeps until the next decision).
    keep_warm_for_ms: float = Field(default=1000.0, gt=0)

    @model_validator(mode="after")
    def _warm_ups_can_run(self) -> Settings:
        if self.keep_warm_ms > self.keep_warm_for_ms:
            raise ValueError(
                f"keep_warm_for_ms ({self.keep_warm_for_ms:g}) is shorter than keep_warm_ms "
                f"({self.keep_warm_ms:g}): no warm-up would ever run"
            )
        return self

    @field_validator("admin_token", mode="after")
    @classmethod
    def _blank_is_none(cls, v: SecretStr | None) -> SecretStr | None:
        """An empty or blank token would match an empty bearer: it means closed."""
        if v is not None and not v.get_secret_value().strip():
            return None
        return v

    @field_validator("api_keys", mode="after")
    @classmethod
    def _no_blank_keys(cls, v: list[SecretStr]) -> list[SecretStr]:
        if any(not k.get_secret_value().strip() for k in v):
            raise ValueError("api_keys must not be empty or blank")
        return v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            dotenv_settings,
            YamlConfigSettingsSource(settings_cls),
        )


def load_settings(
    config: Path | str | None = None, *, env_file: Path | str | None = None, **overrides: Any
) -> Settings:
    """Settings from arguments, the environment, a dotenv file and a YAML file (or
    `EDGEROUTE_CONFIG`), in that order of precedence, nested keys merged."""
    path = config or os.environ.get("EDGEROUTE_CONFIG") or None
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text())  # a missing file is an error
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"{path}: the config file must hold a mapping")

    class _Sourced(Settings):
        model_config = SettingsConfigDict(yaml_file=path, env_file=env_file)

    return _Sourced(**overrides)
