"""Anthropic routes: ``POST /v1/messages`` (streaming and not) and ``POST /v1/messages/count_tokens``.

The body is checked and normalised by :mod:`llmman.protocol.anthropic.messages` (Anthropic's own checks,
then Ollama's capability checks: tools and images need the model's ``tools``/``vision``, ``thinking`` is
relaxed for a model that cannot think and otherwise mapped to llama-server's reasoning controls); the
request goes through the pipeline (api/inference.py) and, served here, to the child's own ``/v1/messages``
(or ``/v1/messages/count_tokens``); answers are fixed up (id, model, ping, block order, errors) by the
same module; a stream always begins with ``message_start`` and ``ping``, made when the child left them
out, with the input tokens counted on the child (:func:`_counted`). A request whose ``tool_choice``
forces a tool goes to the child's ``/v1/chat/completions`` with a JSON-schema grammar instead,
translated both ways by :mod:`llmman.protocol.anthropic.tools`. Errors before the first byte carry
their real status in Anthropic's shape (api/errors.py picks the shape by path); after it, one ``error``
event ends the stream.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from functools import partial

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import Response

from llmman.api.cancel import unless_disconnected
from llmman.api.inference import Call, run
from llmman.api.relay import stream_answer
from llmman.api.services import Services
from llmman.errors import BadRequest, LlmmanError
from llmman.gateway import ResolvedModel, UpstreamExchange
from llmman.protocol.anthropic.messages import (
    AnthropicStream,
    apply_thinking,
    fix_message,
    prepare_request,
    starts_with_message_start,
    upstream_error,
)
from llmman.protocol.anthropic.tools import ForcedToolStream, forced_message, forced_request
from llmman.protocol.anthropic.validate import forced_tool
from llmman.protocol.capabilities import anthropic_needs, capability_error
from llmman.protocol.conversation import conversation_key
from llmman.protocol.transducer import SSETransducer

log = logging.getLogger("llmman.api.anthropic")

JSON = "application/json"
#: Seconds a count of input tokens (for a stream whose child sent no message_start) may take.
COUNT_TIMEOUT = 5.0
#: The most bytes held while waiting for the child's first whole event.
COUNT_HEAD = 1 << 16


def _parse(raw: bytes) -> object:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"The request body is not valid JSON: {exc}") from None


async def messages(request: Request) -> Response:
    """``POST /v1/messages``."""
    return await _forward(request, "/v1/messages")


async def count_tokens(request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}`` from the model's own tokenizer."""
    return await _forward(request, "/v1/messages/count_tokens")


async def _forward(request: Request, path: str) -> Response:
    counting = path == "/v1/messages/count_tokens"
    body, name = prepare_request(_parse(await request.body()), count_tokens=counting)
    conversation = conversation_key(name, body.get("messages"), body.get("system"))
    return await run(request, Call(name, partial(_serve, request, path, body, name),
                                   conversation=conversation))


async def _serve(request: Request, path: str, body: dict[str, object], name: str,
                 model: ResolvedModel) -> Response:
    """The local step: capabilities, thinking, then the child's own Anthropic route (or forced tools)."""
    services: Services = request.app.state.services
    counting = path == "/v1/messages/count_tokens"
    have = services.store.info(model.stored).capabilities
    if not counting:  # counting tokens generates nothing: any model may count
        refusal = capability_error(name, "chat", anthropic_needs(body), have)
        if refusal is not None:
            raise BadRequest(refusal)
    body = apply_thinking(body, "thinking" in have)
    forced = None if counting else forced_tool(body)
    if forced is not None:
        return await _forced(request, services, model, name, body, forced)
    stream = body.get("stream") is True and not counting
    exchange = await unless_disconnected(request, services.gateway.open(model, path, orjson.dumps(body)))
    if exchange.status != 200:
        status, err = upstream_error(exchange.status, await exchange.read())
        return Response(orjson.dumps(err), status_code=status, media_type=JSON)
    if stream:
        events = AnthropicStream(name, message_id="msg_" + uuid.uuid4().hex)
        return stream_answer(exchange, SSETransducer(events), media_type="text/event-stream",
                             chunks=_counted(exchange, events, body))
    answer = await _answer(request, exchange)
    if not counting and isinstance(answer, dict):
        answer = fix_message(answer, name)
    return Response(orjson.dumps(answer), media_type=JSON)


async def _forced(request: Request, services: Services, model: ResolvedModel, name: str,
                  body: dict[str, object], tools: list[dict[str, object]]) -> Response:
    """A request whose ``tool_choice`` forces a tool: through ``/v1/chat/completions`` with a grammar."""
    upstream = forced_request(body, tools)
    opening = services.gateway.open(model, "/v1/chat/completions", orjson.dumps(upstream))
    exchange = await unless_disconnected(request, opening)
    if exchange.status != 200:
        status, err = upstream_error(exchange.status, await exchange.read())
        return Response(orjson.dumps(err), status_code=status, media_type=JSON)
    if upstream.get("stream") is True:
        return _streaming(exchange, ForcedToolStream(name, tools))
    answer = await _answer(request, exchange)
    if not isinstance(answer, dict):
        raise LlmmanError("llama-server sent an answer that is not a JSON object")
    return Response(orjson.dumps(forced_message(answer, tools, name)), media_type=JSON)


async def _answer(request: Request, exchange: UpstreamExchange) -> object:
    data = await unless_disconnected(request, exchange.read())
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise LlmmanError("llama-server sent an answer that is not JSON") from exc


async def _counted(exchange: UpstreamExchange, events: AnthropicStream,
                   body: dict[str, object]) -> AsyncIterator[bytes]:
    """The child's chunks; when its first event is not ``message_start`` (llama-server under CPU load),
    the prompt's tokens are counted first on the same child (its ``/v1/messages/count_tokens``) for the
    ``message_start`` llmman sends instead. A count that fails or takes over :data:`COUNT_TIMEOUT` s
    leaves ``input_tokens`` at 0."""
    head: bytes | None = b""
    async for chunk in exchange.chunks():
        if head is None:
            yield chunk
            continue
        head += chunk
        starts = starts_with_message_start(head)
        if starts is None and len(head) < COUNT_HEAD:
            continue
        if starts is False:
            events.input_tokens = await _count(exchange.lease.base_url, body)
        out, head = head, None
        yield out
    if head:
        yield head


async def _count(base_url: str, body: dict[str, object]) -> int | None:
    counting = {k: body[k] for k in ("model", "messages", "system", "tools") if k in body}
    try:
        timeout = aiohttp.ClientTimeout(total=COUNT_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.post(
                base_url + "/v1/messages/count_tokens", data=orjson.dumps(counting),
                headers={"Content-Type": JSON}) as response:
            answer = orjson.loads(await response.read()) if response.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
        log.info("counting the input tokens of a stream without message_start failed: %s", exc)
        return None
    tokens = answer.get("input_tokens") if isinstance(answer, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


def _streaming(exchange: UpstreamExchange, events: AnthropicStream | ForcedToolStream) -> Response:
    return stream_answer(exchange, SSETransducer(events), media_type="text/event-stream")
