"""llama-server's own routes that llmman serves per model (api/llama_routes.py): which paths, which child.

The paths are llama-server's, with the model named in the body's ``model`` (as llama-swap does):
``/tokenize``, ``/detokenize``, ``/apply-template``, ``/infill``, and reranking on ``/rerank``,
``/reranking``, ``/v1/rerank``, ``/v1/reranking``. Reranking runs on the model's embedding child, and only
for a reranker: a GGUF whose pooling type is ``rank`` (:func:`reranks`).
"""

from __future__ import annotations

from collections.abc import Mapping

from llmman.gguf.types import ArraySummary

__all__ = [
    "CHAT_CHILD_PATHS", "RANK_POOLING", "RERANK_PATHS", "TOP_N_MAX", "detokenize_error", "reranking_error",
    "reranks", "top_n_error",
]

#: Routes served by the model's chat child (``/infill`` needs the ``insert`` capability).
CHAT_CHILD_PATHS = ("/tokenize", "/detokenize", "/apply-template", "/infill")
#: Routes served by the model's embedding child, for a reranker only.
RERANK_PATHS = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")
#: ``LLAMA_POOLING_TYPE_RANK``, the ``<arch>.pooling_type`` of a reranker's GGUF.
RANK_POOLING = 4


def reranks(architecture: str, metadata: Mapping[str, object]) -> bool:
    """True for a reranking model: its GGUF's ``<architecture>.pooling_type`` is ``rank``."""
    return metadata.get(f"{architecture}.pooling_type") == RANK_POOLING


def reranking_error(model: str) -> str:
    """The refusal of a rerank request to a model that is not a reranker."""
    return (f"{model} does not support reranking: it is not a reranking model (its GGUF's pooling type "
            "is not rank)")


def detokenize_error(tokens: object, metadata: Mapping[str, object]) -> str | None:
    """Why a ``/detokenize`` body's ``tokens`` names an id outside the model's vocabulary (the GGUF's
    ``tokenizer.ggml.tokens``), or None. llama-server answers such an id with a 500 (a C++ range check);
    it is the client's mistake, so llmman answers 400 before the child sees it. Anything else about
    ``tokens`` (not a list, not numbers) is left to llama-server, which already answers 400."""
    vocab = metadata.get("tokenizer.ggml.tokens")
    size = vocab.count if isinstance(vocab, ArraySummary) else len(vocab) if isinstance(vocab, list) else None
    if size is None or not isinstance(tokens, list):
        return None
    for token in tokens:
        if isinstance(token, int | float) and not isinstance(token, bool) and not 0 <= token < size:
            return f"token {token} is not in the model's vocabulary (ids 0 to {size - 1})"
    return None


#: The most ``top_n`` llama-server reads correctly: it keeps the value in a 32-bit int, so a larger one
#: wraps (2**40 became 0 results, 2**31 a 500) and a negative one fails its vector resize with a 500.
TOP_N_MAX = 2**31 - 1


def top_n_error(value: object) -> str | None:
    """Why a rerank body's ``top_n`` is refused (a number below 0 or above :data:`TOP_N_MAX`), or None.
    One larger than the number of documents is fine (all of them come back, as Cohere's API does); a value
    of another type is left to llama-server as before."""
    if isinstance(value, int | float) and not isinstance(value, bool) and not 0 <= value <= TOP_N_MAX:
        return f"top_n must be between 0 and {TOP_N_MAX}, got {value}"
    return None
