"""How much memory a model takes: an estimate from the GGUF header before loading, and the real
figure parsed from llama-server's log after loading.

Estimate (bytes; docs/memory.md, constants checked against b11434's own log lines):

- **weights** = the GGUF's tensor data bytes (+ the projector file for multimodal models);
- **KV cache** = ``Σ_layers cells(l) × n_head_kv(l) × (key_len × bK + value_len × bV)`` where
  ``cells`` is ``n_ctx × n_parallel`` for full-attention layers and, for the sliding-window layers
  of Gemma 2/3, gpt-oss and Cohere 2, ``min(n_ctx, pad256(n_swa + n_ubatch)) × n_parallel``;
  ``key_len``/``value_len`` default to ``embedding_length / head_count``; ``bK``/``bV`` from the cache
  type (f16 2 bytes, q8_0 34/32, q4_0 18/32, ...);
- **compute buffer** ≈ ``n_ubatch × 4 B × 4.5 × (embedding_length + feed_forward_length)`` (a fit to
  llama-server's ``compute buffer size`` lines; the graph allocator's real figure depends on the
  backend and flash attention);
- **output buffer** = ``n_vocab × 4 B × n_parallel`` (the logits of one token per slot).

Not counted: llama-server's prompt cache (``--cache-ram``, up to 8 GiB of host RAM, filled only by
use), CPU weight repacking (a few percent on some quantisations), and the process itself.

After loading, :func:`parse_buffers` reads the ``<DEV> model|KV|compute|output|RS buffer size = N MiB``
lines llama-server prints at ``--log-verbosity 4``; buffers on ``CPU*``/``*_Host`` are host memory,
everything else device memory (Ollama's rule, ``llm/llama_server.go``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from llmman.gguf import ArraySummary, GGUFInfo

__all__ = ["KV_BYTES", "Estimate", "Usage", "estimate", "parse_buffers"]

N_UBATCH = 512  # llama-server's default -ub
KV_BYTES = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
    "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32,
}  # fmt: skip
"""Bytes per K or V element for each ``--cache-type-k/-v``."""

SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gpt-oss": 2, "cohere2": 4}
"""Every Nth layer is full attention, the others sliding-window (llama.cpp's ``n_swa_pattern``)."""

_BUFFER = re.compile(r"\b([A-Za-z0-9_]+)\s+(model|KV|compute|output|RS)\s+buffer size\s*=\s*([0-9.]+)\s*MiB")
_MIB = 1024 * 1024


@dataclass(frozen=True)
class Estimate:
    """A model's predicted footprint, bytes per part."""

    weights: int
    kv: int
    compute: int
    output: int

    @property
    def total(self) -> int:
        """Bytes in all."""
        return self.weights + self.kv + self.compute + self.output


@dataclass(frozen=True)
class Usage:
    """What llama-server reported after loading: bytes in host memory and in device memory."""

    host: int
    device: int

    @property
    def total(self) -> int:
        return self.host + self.device


def _pad(n: int, to: int = 256) -> int:
    return int(math.ceil(n / to) * to)


def _per_layer(value: int | tuple[int, ...] | None, layers: int, default: int) -> list[int]:
    if isinstance(value, tuple):
        return list(value[:layers]) + [default] * max(0, layers - len(value))
    return [value if value is not None else default] * layers


def _vocab(info: GGUFInfo) -> int:
    size = info.metadata.get(f"{info.architecture}.vocab_size")
    if isinstance(size, int):
        return size
    tokens = info.metadata.get("tokenizer.ggml.tokens")
    return tokens.count if isinstance(tokens, ArraySummary) else 32000


def estimate(
    info: GGUFInfo,
    *,
    n_ctx: int,
    n_parallel: int = 1,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    extra_weights: int = 0,
    n_ubatch: int = N_UBATCH,
) -> Estimate:
    """Predict the memory of ``info``'s model served with ``n_parallel`` slots of ``n_ctx`` tokens.

    Args:
        info: the parsed GGUF header (first shard merged for split models).
        n_ctx: tokens per slot; n_parallel: slots (``-np``).
        cache_type_k, cache_type_v: ``--cache-type-k/-v`` (unknown types count as f16).
        extra_weights: bytes of other files loaded with it (``--mmproj``).
        n_ubatch: the physical batch (``-ub``; Ollama's ``num_batch``): the compute buffer and the
            sliding-window cells scale with it.
    """
    layers = info.block_count or 0
    embd = info.embedding_length or 0
    heads = _per_layer(info.head_count, layers, 1)
    kv_heads = _per_layer(info.head_count_kv, layers, heads[0] if heads else 1)
    head_dim = embd // max(1, heads[0]) if heads else 0
    k_len = info.key_length or head_dim
    v_len = info.value_length or head_dim
    bk = KV_BYTES.get(cache_type_k, 2.0)
    bv = KV_BYTES.get(cache_type_v, 2.0)
    raw_window = info.metadata.get(f"{info.architecture}.attention.sliding_window")
    window = raw_window if isinstance(raw_window, int) else 0
    pattern = SWA_PATTERN.get(info.architecture, 0) if window > 0 else 0
    full_cells = _pad(n_ctx * n_parallel)
    swa_cells = min(n_ctx, _pad(window + n_ubatch)) * n_parallel if pattern else full_cells
    kv = 0.0
    for layer in range(layers):
        cells = full_cells if not pattern or (layer + 1) % pattern == 0 else swa_cells
        kv += cells * kv_heads[layer] * (k_len * bk + v_len * bv)
    ff = info.metadata.get(f"{info.architecture}.feed_forward_length")
    ff_len = ff if isinstance(ff, int) else (max(ff) if isinstance(ff, list) and ff else 4 * embd)
    compute = int(n_ubatch * 4 * 4.5 * (embd + ff_len))
    output = _vocab(info) * 4 * n_parallel
    weights = (info.tensor_bytes or info.file_size) + extra_weights
    return Estimate(weights=weights, kv=int(kv), compute=compute, output=output)


def parse_buffers(lines: Iterable[str]) -> Usage | None:
    """Sum llama-server's ``... buffer size = N MiB`` lines into host and device bytes.

    Returns None when no such line is present (the child logged below verbosity 4).
    """
    host = device = 0.0
    seen = False
    for line in lines:
        match = _BUFFER.search(line)
        if match is None:
            continue
        seen = True
        name, size = match.group(1), float(match.group(3)) * _MIB
        if name.startswith("CPU") or name.endswith("_Host"):
            host += size
        else:
            device += size
    return Usage(host=int(host), device=int(device)) if seen else None
