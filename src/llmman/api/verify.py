"""``POST /api/verify {"models"?: [name, ...], "repair"?: bool}``: the daemon's ``llmman verify``.

Hashes every blob of the store (or of the named models) against its digest and streams the NDJSON lines
of :func:`llmman.registry.fsck.verify_store` (one per blob, repair progress, a closing ``done`` line with
the count still bad). 404 ``model '<name>' not found`` for a name the store lacks, 400 for mistyped
fields, both before anything is hashed. Repairs pull through the daemon's puller (its credentials,
options and offline rule), else copy from each peer that is up (``/v2/``, pinned to the stored digest);
a loaded model that lost a blob is unloaded first.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from llmman.api.pull import _run
from llmman.api.services import Services
from llmman.cluster.copy import PullSource, copy_from_peer
from llmman.config.table import HostAddress
from llmman.errors import BadRequest
from llmman.protocol.ollama.fields import parse_json_body
from llmman.refs import Reference, parse_reference
from llmman.registry.fsck import Source, verify_store


async def verify(request: Request) -> Response:
    """``POST /api/verify``; an empty body checks the whole store."""
    services: Services = request.app.state.services
    raw = await request.body()
    body = parse_json_body(raw) if raw.strip() else {}
    models, repair = body.get("models"), body.get("repair")
    if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) for m in models)):
        raise BadRequest("models must be a list of model names")
    if repair is not None and not isinstance(repair, bool):
        raise BadRequest("repair must be a boolean")
    refs = [parse_reference(m, services.settings.aliases) for m in models] if models else None
    services.store.entries(refs)  # 404 for an unknown name, before the stream starts
    puller = services.puller
    loop = asyncio.get_running_loop()
    sources: list[Source] = []
    if puller is not None and services.peers is not None:
        key = services.peers.api_key
        for address in services.peers.up():
            def source(ref: Reference, address: HostAddress = address) -> object:
                assert puller is not None
                return copy_from_peer(puller, ref, PullSource(address, key, ref.digest or ""))

            sources.append(source)

    def unload(name: str) -> bool:
        return asyncio.run_coroutine_threadsafe(services.scheduler.unload(name), loop).result()

    return await _run(lambda emit: verify_store(services.store, refs, emit, repair=repair is True,
                                                puller=puller, sources=sources, unload=unload), True)
