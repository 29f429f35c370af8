"""``GET /llmman/logs``: a node's logs over the API, for ``llmman logs`` (llmman.cli.commands_logs).

Parameters (all optional):

- ``model=REF``: that model's llama-server log (``<logs_dir>/<reference>.log``, llmman.runner.logs);
  without it, the daemon's own log (``<logs_dir>/llmman.log``). ``embedding=1`` picks the model's
  embedding child instead of its chat child. The file is named by the scheduler's rule
  (:func:`llmman.runner.logfiles.child_log_name`) from the reference as the store resolves it; nothing
  from the client is used as a path.
- ``tail=N``: the last N lines first (default :data:`DEFAULT_TAIL`, at most :data:`MAX_TAIL`; 0 = none).
- ``follow=1``: then every new line as it is written, across rotations, until the client goes away.
- ``node=NAME``: another node's logs: resolved like ``llmman drain NODE`` (llmman.api.drain: this node's
  name or ``host:port`` mean this node, else a peer's address or ``/llmman/node`` name) and fetched from
  that peer, streamed back as it comes; an unknown node is 404.

The answer is ``text/plain``, one log line per line. A model with no log file on the node is 404 (it was
never loaded there). Behind the API key like every route.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlencode

import aiohttp
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from llmman.api.drain import is_this_node, named_peer
from llmman.api.services import Services
from llmman.cluster.peers import Peers, peer_name
from llmman.config.table import HostAddress
from llmman.errors import BadRequest, LlmmanError, ModelNotFound, NotFound
from llmman.refs import parse_reference
from llmman.runner import logfiles

DEFAULT_TAIL = 100
MAX_TAIL = 100_000
TEXT = "text/plain; charset=utf-8"


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _tail(request: Request) -> int:
    """The ``tail`` parameter.

    Raises:
        BadRequest: not a whole number from 0 to MAX_TAIL.
    """
    text = request.query_params.get("tail", "").strip()
    if not text:
        return DEFAULT_TAIL
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"tail must be a number of lines, not {text!r}") from None
    if not 0 <= value <= MAX_TAIL:
        raise BadRequest(f"tail must be between 0 and {MAX_TAIL}")
    return value


def log_path(services: Services, model: str, *, embedding: bool = False) -> Path:
    """The log file of ``model`` on this node (the daemon's own log for ``''``).

    Raises:
        ModelNotFound: ``model`` does not parse as a reference.
        NotFound: ``model`` has no log on this node.
    """
    logs_dir = services.settings.logs_dir
    if not model:
        return logs_dir / logfiles.DAEMON_LOG
    try:
        reference = services.gateway.resolve(model).stored.reference
    except ModelNotFound:  # deleted since, or never stored here: its log may still be there
        try:
            reference = str(parse_reference(model, services.settings.aliases))
        except LlmmanError:
            raise ModelNotFound(model) from None
    key = reference + "#embedding" if embedding else reference
    path = logs_dir / logfiles.child_log_name(key)
    if not logfiles.exists(path, services.settings.file_count):
        raise NotFound(f"model {model!r} has no log on this node (it was never loaded here)")
    return path


def _followed(path: Path, tail: int, backups: int) -> AsyncIterator[bytes]:
    """The last ``tail`` lines, then each new one. The tail is read and the file opened for following
    now, in the handler (before the answer starts, and with no await between them: this daemon writes its
    logs from the event loop), so no line is missed or sent twice."""
    old = "".join(line + "\n" for line in logfiles.tail(path, tail, backups)).encode("utf-8")
    return _emit(old, logfiles.Follower(path))


async def _emit(old: bytes, follower: logfiles.Follower) -> AsyncIterator[bytes]:
    try:
        if old:
            yield old
        async for line in follower.lines():
            yield (line + "\n").encode("utf-8")
    finally:
        follower.close()


async def logs(request: Request) -> Response:
    """``GET /llmman/logs?model=REF&tail=N&follow=1&node=NAME``."""
    services: Services = request.app.state.services
    params = request.query_params
    name = params.get("node", "").strip()
    tail, follow = _tail(request), _flag(request, "follow")
    if not is_this_node(services, name):
        address = await named_peer(request, services, name)
        query = {key: value for key, value in params.items() if key != "node"}
        return await _from_peer(services, address, query)
    path = log_path(services, params.get("model", "").strip(), embedding=_flag(request, "embedding"))
    if not follow:
        text = "".join(line + "\n" for line in logfiles.tail(path, tail, services.settings.file_count))
        return Response(text, media_type=TEXT)
    return StreamingResponse(_followed(path, tail, services.settings.file_count), media_type=TEXT)


async def _from_peer(services: Services, address: HostAddress, query: dict[str, str]) -> Response:
    """The peer's ``/llmman/logs`` for ``query``, streamed back as it comes (its error as it came).

    Raises:
        LlmmanError: 502 when the peer does not answer.
    """
    peers = services.peers
    assert isinstance(peers, Peers)
    url = address.client_url() + "/llmman/logs" + (f"?{urlencode(query)}" if query else "")
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=max(peers.timeout, 5.0))
    try:
        response = await peers.session.get(url, headers=peers.headers(), timeout=timeout)
    except (OSError, aiohttp.ClientError, TimeoutError) as exc:
        raise LlmmanError(f"node {peer_name(address)} did not answer: {str(exc) or type(exc).__name__}",
                          status=502, code="peer_failed") from exc
    if response.status >= 400:
        try:
            body = await response.read()
        finally:
            response.release()
        media = response.headers.get("content-type", "application/json; charset=utf-8")
        return Response(body, status_code=response.status, media_type=media)

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        except (OSError, aiohttp.ClientError) as exc:  # the peer went away: say so as the last line
            yield f"[llmman] the log stream from {peer_name(address)} ended: {exc}\n".encode()
        finally:
            response.close()

    return StreamingResponse(relay(), media_type=TEXT)
