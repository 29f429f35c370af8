"""``POST /api/verify {"models"?: [name, ...], "repair"?: bool}``: the daemon's ``llmman verify``.

Hashes every blob of the store (or of the named models) against its digest and streams the NDJSON lines
of :func:`llmman.registry.fsck.verify_store` (one per blob, repair progress, a closing ``done`` line with
the count still bad). 404 ``model '<name>' not found`` for a name the store lacks, 400 for mistyped
fields, both before anything is hashed. Repairs pull through the daemon's puller (its credentials,
options and offline rule).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from llmman.api.pull import _run
from llmman.api.services import Services
from llmman.errors import BadRequest
from llmman.protocol.ollama.fields import parse_json_body
from llmman.refs import parse_reference
from llmman.registry.fsck import verify_store


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
    return await _run(lambda emit: verify_store(services.store, refs, emit, repair=repair is True,
                                                puller=puller), True)
