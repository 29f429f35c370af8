"""An Ollama prompt longer than the context, cut to fit on the model's own child.

Called by api/ollama_infer.py once llama-server has refused a request as longer than its slot
(:func:`~llmman.protocol.ollama.truncate.overflow`) and ``truncate`` is not false. The rules are
protocol/ollama/truncate.py's (Ollama's); this module asks the child that will serve the request for what
they need: the chat rendered by its template (``/apply-template``), token counts (``/tokenize``) and text
back from tokens (``/detokenize``). Each call goes to the same child (the same ``num_ctx``) through
:meth:`Gateway.open`, like the request itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from starlette.requests import Request

from llmman.api.cancel import unless_disconnected
from llmman.api.services import Services
from llmman.errors import BadRequest, LlmmanError
from llmman.gateway import ResolvedModel
from llmman.protocol.errors import upstream_text
from llmman.protocol.ollama.request import CHAT_PATH, UpstreamRequest
from llmman.protocol.ollama.truncate import (
    DEFAULT_NUM_KEEP,
    REFUSAL,
    Message,
    Overflow,
    cut_order,
    first_plausible,
    keep_head_and_tail,
    kept,
    message_text,
    pre_cut,
    prompt_target,
    starts,
    with_text,
)

#: How many times a chat's text is cut again when the first cut did not reach the target (a token at the
#: boundary of the cut can merge with its neighbour and change the count by a few).
_RECUTS = 4

_Size = Callable[[list[Message]], Awaitable[int]]


class Child:
    """The tokenizer and template of the child serving one request (the same ``keep_alive`` and
    ``num_ctx``, so the same child)."""

    def __init__(self, request: Request, model: ResolvedModel, upstream: UpstreamRequest) -> None:
        self._request = request
        self._model = model
        self._keep_alive = upstream.keep_alive_s
        self._num_ctx = upstream.runner.num_ctx
        self._options = upstream.runner

    async def _post(self, path: str, doc: dict[str, object]) -> dict[str, object]:
        services: Services = self._request.app.state.services
        opening = services.gateway.open(self._model, path, orjson.dumps(doc), keep_alive=self._keep_alive,
                                        num_ctx=self._num_ctx, options=self._options)
        exchange = await unless_disconnected(self._request, opening)
        data = await unless_disconnected(self._request, exchange.read())
        try:
            answer = orjson.loads(data) if exchange.status == 200 else None
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise LlmmanError(f"llama-server's {path} answered {exchange.status}: {upstream_text(data)}")
        return answer

    async def tokens(self, text: str, *, special: bool) -> list[int]:
        """``text`` tokenized as the child tokenizes a prompt (``special``: with BOS and special tokens)."""
        answer = await self._post("/tokenize", {"content": text, "add_special": special,
                                                "parse_special": special})
        tokens = answer.get("tokens")
        if not isinstance(tokens, list):
            raise LlmmanError("llama-server's /tokenize answered no tokens")
        return [t for t in tokens if isinstance(t, int)]

    async def text(self, tokens: list[int]) -> str:
        """The text of ``tokens``."""
        answer = await self._post("/detokenize", {"tokens": tokens})
        content = answer.get("content")
        return content if isinstance(content, str) else ""

    async def rendered(self, body: dict[str, object], messages: list[Message]) -> int:
        """How many tokens the chat ``body`` takes with ``messages``, as its template renders it."""
        answer = await self._post("/apply-template", {**body, "messages": messages})
        prompt = answer.get("prompt")
        if not isinstance(prompt, str):
            raise LlmmanError("llama-server's /apply-template answered no prompt")
        return len(await self.tokens(prompt, special=True))


def _num_keep(body: dict[str, object]) -> int:
    value = body.get("n_keep")  # options.num_keep, as protocol/ollama/fields.py maps it
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return DEFAULT_NUM_KEEP


async def fitted(request: Request, model: ResolvedModel, upstream: UpstreamRequest,
                 over: Overflow) -> dict[str, object]:
    """``upstream``'s body cut to fit the context ``over`` reports: a chat (``/api/chat``, and
    ``/api/generate`` through the template) drops its oldest messages, then cuts the text of what is left
    from its front; a raw prompt keeps its first ``num_keep`` tokens and its end.

    Raises:
        BadRequest: :data:`REFUSAL`, when even the cut prompt cannot fit (a context too small for the
            template itself).
        LlmmanError: the child would not tokenize or render.
    """
    child = Child(request, model, upstream)
    target = prompt_target(over.n_ctx, _num_keep(upstream.body))
    if upstream.path != CHAT_PATH:
        return await _fitted_raw(child, upstream.body, target)
    return await _fitted_chat(child, upstream.body, over, target)


async def _fitted_raw(child: Child, body: dict[str, object], target: int) -> dict[str, object]:
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest(REFUSAL)
    tokens = await child.tokens(prompt, special=True)
    added = len(tokens) - len(await child.tokens(prompt, special=False))  # the BOS the tokenizer adds
    return {**body, "prompt": keep_head_and_tail(tokens, target, _num_keep(body) + max(added, 0))}


async def _fitted_chat(child: Child, body: dict[str, object], over: Overflow, target: int
                       ) -> dict[str, object]:
    raw = body.get("messages")
    messages: list[Message] = [m for m in raw if isinstance(m, dict)] if isinstance(raw, list) else []
    # What llama-server counts beyond the rendered text (images, a BOS added twice) counts after a cut too.
    extra = max(over.prompt_tokens - await child.rendered(body, messages), 0)

    async def size(chat: list[Message]) -> int:
        return await child.rendered(body, chat) + extra

    places = starts(messages)
    # The first place whose chat fits: fewer messages never render longer; places whose text is far too
    # long for the target are skipped without asking the child.
    lo, hi = first_plausible(messages, places, target), len(places) - 1
    best: list[Message] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        chat = kept(messages, places[mid])
        if await size(chat) <= target:
            best, hi = chat, mid - 1
        else:
            lo = mid + 1
    if best is None:
        best = await _cut_text(child, kept(messages, places[-1]) if places else [], size, target)
    return {**body, "messages": best}


async def _cut_text(child: Child, chat: list[Message], size: _Size, target: int) -> list[Message]:
    """``chat`` with text cut from the front of its messages (:func:`cut_order`) until it fits."""
    chat = pre_cut(chat, target)
    for index in cut_order(chat):
        for _ in range(_RECUTS):
            excess = await size(chat) - target
            if excess <= 0:
                return chat
            tokens = await child.tokens(message_text(chat[index]), special=False)
            if not tokens:
                break
            keep = tokens[min(excess, len(tokens)):]
            chat[index] = with_text(chat[index], await child.text(keep) if keep else "")
    if await size(chat) > target:
        raise BadRequest(REFUSAL)
    return chat
