"""Ollama embeddings (``/api/embed``, legacy ``/api/embeddings``) over llama-server's ``/v1/embeddings``
(Ollama's ``api.EmbedRequest``/``api.EmbeddingRequest``; the child runs with ``--embeddings``). No I/O.

- ``/api/embed`` ``{model, input: str | [str], truncate = true, dimensions?, keep_alive?, options?}`` ->
  ``{model, embeddings: [[float]], total_duration, load_duration, prompt_eval_count}``. ``dimensions``
  keeps the first N values and L2-normalises them again (Ollama's rule); an empty ``input`` only loads.
- ``/api/embeddings`` ``{model, prompt, keep_alive?, options?}`` -> ``{embedding: [float]}``; an empty
  ``prompt`` answers ``{"embedding": []}``.

``/v1/embeddings`` passes the client's bytes on, but llama-server ignores ``dimensions``: llmman applies it
to the answer (:func:`shorten_answer`, float or base64 rows), as Ollama and OpenAI do.

llama-server's vectors are already L2-normalised. An input longer than the child's per-slot context is
cut to it (``truncate``, default true, as Ollama; also on ``/v1/embeddings`` and ``/api/embeddings``, as
Ollama's own routes do) or, with ``truncate: false``, refused with 400 ``the input length exceeds the
context length``: the route tries the inputs as sent and, only when llama-server refuses one as too long
(:func:`too_long`), tokenizes them on the child and sends token arrays cut by :func:`fit_tokens`.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from llmman.errors import BadRequest, LlmmanError
from llmman.protocol.ollama.fields import require_model, runner_options

__all__ = ["TOO_LONG", "EmbedRequest", "embed_request", "fit_tokens", "legacy_request",
           "ollama_embed_response", "shorten_answer", "too_long", "vectors"]

TOO_LONG = "the input length exceeds the context length"
"""Ollama's 400 message for an input over the context with ``truncate: false`` (Ollama's words)."""


@dataclass(frozen=True)
class EmbedRequest:
    """A parsed Ollama embeddings request: ``inputs`` (empty: load only), ``dimensions`` (None: all),
    ``keep_alive`` as sent (seconds, duration string or None), ``truncate`` (cut over-long inputs to the
    context, Ollama's default) and ``num_ctx`` (tokens, from ``options``; None: the default)."""

    model: str
    inputs: list[str]
    dimensions: int | None
    keep_alive: object
    truncate: bool = True
    num_ctx: int | None = None

    def upstream(self) -> dict[str, object]:
        """The ``/v1/embeddings`` body (floats, not base64)."""
        return {"model": self.model, "input": self.inputs, "encoding_format": "float"}


def embed_request(body: Mapping[str, object]) -> EmbedRequest:
    """Parse ``/api/embed``.

    Raises:
        BadRequest: ``model is required``; ``invalid input type`` (Ollama's words) unless ``input`` is a
            string or an array of strings; ``dimensions`` not a positive integer; ``truncate`` not a boolean.
    """
    model = require_model(dict(body))
    raw = body.get("input")
    if raw is None or raw == "":
        inputs: list[str] = []
    elif isinstance(raw, str):
        inputs = [raw]
    elif isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        inputs = [str(x) for x in raw]
    else:
        raise BadRequest("invalid input type")
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise BadRequest("dimensions must be a positive integer")
    truncate = body.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise BadRequest("truncate must be a boolean")
    return EmbedRequest(model, inputs, dims, body.get("keep_alive"), truncate is not False,
                        runner_options(body.get("options")).num_ctx)


def legacy_request(body: Mapping[str, object]) -> EmbedRequest:
    """Parse ``/api/embeddings`` (``prompt`` instead of ``input``).

    Raises:
        BadRequest: as :func:`embed_request`; ``prompt must be a string``.
    """
    model = require_model(dict(body))
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise BadRequest("prompt must be a string")
    return EmbedRequest(model, [prompt] if prompt else [], None, body.get("keep_alive"),
                        num_ctx=runner_options(body.get("options")).num_ctx)


def too_long(status: int, message: str) -> bool:
    """Whether a llama-server error answer means an input did not fit: 400 ``request (N tokens) exceeds the
    available context size`` or 500 ``input (N tokens) is too large to process`` (llama-server's
    own error texts)."""
    return (status == 400 and "exceeds the available context size" in message) or (
        status >= 500 and "too large to process" in message)


def fit_tokens(inputs: list[list[int]], n_ctx: int, *, truncate: bool) -> list[list[int]]:
    """Token arrays cut to ``n_ctx`` tokens each (Ollama keeps the head of an over-long input).

    Raises:
        BadRequest: ``the input length exceeds the context length`` when ``truncate`` is false and an input
            has more than ``n_ctx`` tokens (Ollama's rule and words).
    """
    if not truncate and any(len(tokens) > n_ctx for tokens in inputs):
        raise BadRequest(TOO_LONG)
    return [tokens[:n_ctx] for tokens in inputs]


def _cut(vector: list[float], dimensions: int | None) -> list[float]:
    if dimensions is None or dimensions >= len(vector):
        return vector
    head = vector[:dimensions]
    norm = math.sqrt(sum(v * v for v in head))
    return [v / norm for v in head] if norm > 0 else head


def _cut_base64(text: str, dimensions: int) -> str:
    """A base64 row of little-endian float32 values, cut to ``dimensions`` and L2-normalised again."""
    raw = base64.b64decode(text, validate=True)
    count = len(raw) // 4
    values = list(struct.unpack(f"<{count}f", raw[: count * 4]))
    cut = _cut(values, dimensions)
    return base64.b64encode(struct.pack(f"<{len(cut)}f", *cut)).decode("ascii")


def shorten_answer(answer: object, dimensions: int) -> object:
    """A ``/v1/embeddings`` answer with every ``data[].embedding`` cut to ``dimensions`` values and
    L2-normalised again (a float array, or a base64 string of float32 values). Rows already no longer
    than ``dimensions`` are kept; anything not shaped like an answer is returned unchanged."""
    if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
        return answer
    rows: list[object] = []
    for item in answer["data"]:
        if isinstance(item, dict) and isinstance(item.get("embedding"), list):
            item = {**item, "embedding": _cut([float(v) for v in item["embedding"]], dimensions)}
        elif isinstance(item, dict) and isinstance(item.get("embedding"), str):
            try:
                item = {**item, "embedding": _cut_base64(item["embedding"], dimensions)}
            except (ValueError, struct.error):  # binascii.Error is a ValueError: keep the row as sent
                pass
        rows.append(item)
    return {**answer, "data": rows}


def vectors(answer: object, dimensions: int | None = None) -> tuple[list[list[float]], int]:
    """``(embeddings in input order, prompt tokens)`` from a ``/v1/embeddings`` answer.

    Raises:
        LlmmanError: 500 when the answer is not the documented shape.
    """
    if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
        raise LlmmanError("llama-server sent an embeddings answer without data")
    rows: list[tuple[int, list[float]]] = []
    for i, item in enumerate(answer["data"]):
        emb = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(emb, list):
            raise LlmmanError("llama-server sent an embedding that is not an array of numbers")
        index = item.get("index", i)
        rows.append((index if isinstance(index, int) else i, [float(v) for v in emb]))
    usage = answer.get("usage")
    tokens = usage.get("prompt_tokens", 0) if isinstance(usage, dict) else 0
    return [_cut(v, dimensions) for _, v in sorted(rows, key=lambda r: r[0])], int(tokens or 0)


def ollama_embed_response(model: str, embeddings: list[list[float]], *, prompt_tokens: int,
                          total_ns: int, load_ns: int) -> dict[str, object]:
    """The ``/api/embed`` answer object (durations in nanoseconds)."""
    return {"model": model, "embeddings": embeddings, "total_duration": total_ns, "load_duration": load_ns,
            "prompt_eval_count": prompt_tokens}
