"""llama-server's own routes that llmman serves per model (api/llama_routes.py): which paths, which child.

The paths are llama-server's, with the model named in the body's ``model`` (as llama-swap does):
``/tokenize``, ``/detokenize``, ``/apply-template``, ``/infill``, and reranking on ``/rerank``,
``/reranking``, ``/v1/rerank``, ``/v1/reranking``. Reranking runs on the model's embedding child, and only
for a reranker: a GGUF whose pooling type is ``rank`` (:func:`reranks`).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["CHAT_CHILD_PATHS", "RANK_POOLING", "RERANK_PATHS", "reranking_error", "reranks"]

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
