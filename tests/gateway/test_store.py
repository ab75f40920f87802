"""The shared store's state primitives, against the embedded Redis-protocol server."""

from __future__ import annotations

import asyncio

from gateway.store import SharedStore


def test_a_lease_is_held_by_one_replica_until_it_expires() -> None:
    async def run() -> None:
        r1 = SharedStore(None, "r1", 10.0)
        await r1.start()
        r2 = SharedStore(r1.url, "r2", 10.0)
        await r2.start()
        try:
            assert await r1.lease("lease", 0.3)
            assert await r1.lease("lease", 0.3)  # renewed by its holder
            assert not await r2.lease("lease", 0.3)
            await asyncio.sleep(0.5)
            assert await r2.lease("lease", 0.3)  # r1 stopped renewing
            assert not await r1.lease("lease", 0.3)
            await r1.write_fields("h", {"a": "1", "b": "2"})
            await r2.write_fields("h", {"b": "3"})
            assert await r1.read_fields("h") == {"a": "1", "b": "3"}
        finally:
            await r2.close()
            await r1.close()

    asyncio.run(run())
