"""``/api/show``'s ``parameters`` text from a GGUF header (Ollama's ``api.ShowResponse.Parameters``).

Ollama writes one ``key value`` pair per line, the key padded to 30 columns, string values quoted;
clients parse it for ``num_ctx`` and the ``stop`` sequences. llmman reports the context a load would
get (``num_ctx``) and, as ``stop``, the end-of-generation tokens the GGUF names
(``tokenizer.ggml.eos_token_id``, ``eot_token_id``, ``eom_token_id``), which llama-server stops on.
A derived model's own parameters (:mod:`llmman.store.derive`) are listed too and override both.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import orjson

from llmman.errors import GGUFError
from llmman.gguf import ArraySummary, GGUFInfo, read_array

__all__ = ["STOP_TOKEN_KEYS", "modelfile_extras", "options_text", "parameters_text", "stop_tokens"]

log = logging.getLogger("llmman.protocol.ollama.show")

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


def _value(value: object) -> str:
    """One parameter value as Ollama's ``%#v`` writes it: strings quoted, integral numbers without a
    fraction, booleans lowercase."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    if isinstance(value, int | float):
        return repr(value)
    return orjson.dumps(value).decode()


def parameters_text(n_ctx: int, stop: Sequence[str], params: Mapping[str, object] | None = None) -> str:
    """Ollama's ``parameters`` string: one ``key value`` line per parameter, the key padded to 30
    columns, one ``stop`` line per sequence (JSON-quoted), last.

    ``num_ctx`` (context tokens) and ``stop`` come from the load plan and the GGUF unless a derived
    model's ``params`` (its Ollama options) set them; its other options follow ``num_ctx``, sorted by key.
    """
    merged: dict[str, object] = {"num_ctx": n_ctx, **(params or {})}
    if merged.get("stop") is None:
        merged["stop"] = list(stop)
    return options_text(merged)


def options_text(params: Mapping[str, object]) -> str:
    """Ollama options in the ``parameters`` text form: ``num_ctx`` first, then the other keys sorted, then
    one ``stop`` line per sequence; null values are left out."""
    rest = {k: v for k, v in params.items() if v is not None and k not in ("num_ctx", "stop")}
    stop = params.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    lines = [f"{'num_ctx':<30} {_value(params['num_ctx'])}"] if params.get("num_ctx") is not None else []
    lines += [f"{key:<30} {_value(rest[key])}" for key in sorted(rest)]
    lines += [f"{'stop':<30} {_value(s)}" for s in stops]
    return "\n".join(lines)


def _quoted(text: str) -> str:
    return f'"""{text}"""'


def modelfile_extras(system: str, messages: Sequence[Mapping[str, object]], licenses: Sequence[str]) -> str:
    """The ``SYSTEM``, ``MESSAGE`` and ``LICENSE`` lines of a derived model's generated Modelfile
    (Ollama's ``show --modelfile``), each ending in a newline; "" for a plain model."""
    out = f"SYSTEM {_quoted(system)}\n" if system else ""
    for m in messages:
        out += f"MESSAGE {m.get('role', '')} {_quoted(str(m.get('content') or ''))}\n"
    out += "".join(f"LICENSE {_quoted(text)}\n" for text in licenses)
    return out
