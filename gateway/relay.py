"""Noticing a departed client at once, and relaying a stream chunk by chunk.

A proxy must stop its upstream request as soon as the client leaves, not at its
next write. `ClientWatch` cancels the request's own task when the client leaves;
everything else (waiting for the backend, relaying) runs in that task. The
gateway's own HTTP protocol (`gateway.client_protocol`) tells it through a callback
in the scope; under any other ASGI server it waits on `receive()` for
`http.disconnect` in one small task per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import Response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# A scope key: a callable that takes a callback for the server to call if the
# connection is lost before the response is complete.
DISCONNECT_HOOK = "edgeroute.on_disconnect"


class ClientWatch:
    """Cancels the current task if the client disconnects before `finish()`.

    Start it once the request body has been read (it consumes `receive()`); the task
    that started it then sees `asyncio.CancelledError` at its next await, with `gone`
    set.
    """

    def __init__(self) -> None:
        self.gone = False
        self._finished = False
        self._task: asyncio.Task[Any] | None = None
        self._watch: asyncio.Task[None] | None = None

    def start(self, scope: Scope, receive: Receive) -> None:
        self._task = asyncio.current_task()
        hook = scope.get(DISCONNECT_HOOK)
        if hook is not None:
            hook(self._left)
        else:
            self._watch = asyncio.get_running_loop().create_task(self._run(receive))

    async def _run(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._left()

    def _left(self) -> None:
        if not self._finished and self._task is not None:
            self.gone = True
            self._task.cancel()

    def client_left(self) -> bool:
        """On `CancelledError`: True, with the cancellation taken back, when it came from
        this watch; False when someone else cancelled (re-raise then)."""
        if not self.gone:
            return False
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return True

    def finish(self) -> None:
        """The response has been sent (or abandoned): stop watching."""
        self._finished = True
        if self._watch is not None:
            self._watch.cancel()


class RelayResponse(Response):
    """Headers, then each chunk as the generator yields it. When `ended()` says a chunk
    is the last, it goes out with the end of the response, in one write."""

    def __init__(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        chunks: AsyncGenerator[bytes, None],
        ended: Callable[[], bool],
    ) -> None:
        self.status_code = status
        self.raw_headers = headers
        self.chunks = chunks
        self.ended = ended
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        last = b""
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async for chunk in self.chunks:
                if self.ended():
                    last = chunk
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            await self.chunks.aclose()
        # The last await: once it returns the response is complete (see ClientWatch).
        await send({"type": "http.response.body", "body": last, "more_body": False})
