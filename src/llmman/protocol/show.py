"""``/api/show``'s ``parameters`` text from a GGUF header (reference/ollama.md §1.10).

Ollama writes one ``key value`` pair per line, the key padded to 30 columns, string values quoted;
clients parse it for ``num_ctx`` and the ``stop`` sequences. llmman reports the context a load would
get (``num_ctx``) and, as ``stop``, the end-of-generation tokens the GGUF names
(``tokenizer.ggml.eos_token_id``, ``eot_token_id``, ``eom_token_id``), which llama-server stops on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import orjson

from llmman.errors import GGUFError
from llmman.gguf import ArraySummary, GGUFInfo, read_array

__all__ = ["STOP_TOKEN_KEYS", "parameters_text", "stop_tokens"]

log = logging.getLogger("llmman.protocol.show")

STOP_TOKEN_KEYS = (
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
)


def stop_tokens(info: GGUFInfo) -> list[str]:
    """The text of the GGUF's end-of-generation tokens, deduplicated, in :data:`STOP_TOKEN_KEYS` order.

    Reads the vocabulary only up to the highest id needed. A model without a vocabulary, or with ids
    outside it, yields fewer (or no) entries; never raises.
    """
    ids = [v for k in STOP_TOKEN_KEYS if isinstance(v := info.metadata.get(k), int) and v >= 0]
    vocab = info.metadata.get("tokenizer.ggml.tokens")
    if not ids or vocab is None:
        return []
    if isinstance(vocab, ArraySummary):
        try:
            tokens: Sequence[object] = read_array(info.path, vocab, limit=max(ids) + 1)
        except (GGUFError, OSError) as exc:
            log.debug("cannot read the vocabulary of %s: %s", info.path, exc)
            return []
    elif isinstance(vocab, list):
        tokens = vocab
    else:
        return []
    out: list[str] = []
    for i in ids:
        if i < len(tokens) and isinstance(tokens[i], str) and tokens[i] and tokens[i] not in out:
            out.append(str(tokens[i]))
    return out


def parameters_text(n_ctx: int, stop: Sequence[str]) -> str:
    """Ollama's ``parameters`` string: ``num_ctx`` then one ``stop`` line per sequence (JSON-quoted)."""
    lines = [f"{'num_ctx':<30} {n_ctx}"]
    lines += [f"{'stop':<30} {orjson.dumps(s).decode()}" for s in stop]
    return "\n".join(lines)
