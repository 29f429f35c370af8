"""Stop a request's work when its client goes away.

Starlette cancels a :class:`~starlette.responses.StreamingResponse` whose client disconnects, but
a handler that builds one whole answer (``stream: false``, OpenAI without ``stream``) keeps running:
the child would go on generating for nobody and the lease would stay held until it finished.
:func:`unless_disconnected` races such work against the ASGI ``http.disconnect`` message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from llmman.errors import ClientDisconnected

T = TypeVar("T")


async def _disconnected(request: Request) -> None:
    """Return when the client has gone away (call only once the body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise ClientDisconnected (499).

    The request body must already have been read. ``work`` is cancelled (so its ``finally`` blocks
    release leases and close upstream connections) before this returns or raises.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientDisconnected()
    finally:
        task.cancel()
        watcher.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
