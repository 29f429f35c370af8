"""A fast GGUF header reader: metadata, tensor shapes and capabilities in milliseconds.

The file layout (GGUF spec, ggml/docs/gguf.md): magic ``GGUF``, u32
version (2 or 3), u64 tensor count, u64 KV count, the KV pairs (u64-length key, u32 value type, value),
the tensor infos (name, u32 n_dims, u64 dims[], u32 ggml type, u64 offset), padding to
``general.alignment`` (default 32), then the tensor data. All little-endian.

Unlike ``gguf.GGUFReader`` (which maps and expands every array element), this reader keeps scalars,
strings and arrays of at most 64 elements, and for bigger arrays (the 150k-entry tokenizer vocabulary)
records only an :class:`ArraySummary` and seeks past the data (string arrays need one 8-byte length read
per element). It stops at the end of the tensor infos. Results are cached by (path, mtime_ns, size).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

from llmman.gguf.describe import (
    CAPABILITY_ORDER,
    EMBEDDING_ARCHITECTURES,
    describe,
    human_number,
    merge_split,
    model_info,
    with_capability,
)
from llmman.gguf.reader import MAGIC, SMALL_ARRAY, RawHeader, parse_header, read_array
from llmman.gguf.types import FILE_TYPES, GGML_TYPES, ArraySummary, GGUFInfo, TensorInfo

__all__ = [
    "CAPABILITY_ORDER", "EMBEDDING_ARCHITECTURES", "FILE_TYPES", "GGML_TYPES", "MAGIC", "SMALL_ARRAY",
    "ArraySummary", "GGUFInfo", "RawHeader", "TensorInfo", "clear_cache", "describe", "human_number",
    "merge_split", "model_info", "parse_header", "read_array", "read_gguf", "with_capability",
]

_cache: OrderedDict[tuple[str, int, int], GGUFInfo] = OrderedDict()
_cache_lock = threading.Lock()
_CACHE_SIZE = 128


def clear_cache() -> None:
    """Forget every cached :func:`read_gguf` result (benchmarks; files are re-read when they change)."""
    with _cache_lock:
        _cache.clear()


def read_gguf(path: Path) -> GGUFInfo:
    """Read the header of the GGUF file at ``path`` (cached by path, mtime_ns and size).

    Raises:
        GGUFError: not a GGUF (bad magic), version other than 2/3, truncated header or tensor data,
            unknown value type, absurd counts. OSError when the file cannot be opened.
    """
    st = os.stat(path)
    key = (os.fspath(path), st.st_mtime_ns, st.st_size)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    info = describe(Path(path), st.st_size, parse_header(Path(path), st.st_size))
    with _cache_lock:
        _cache[key] = info
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return info
