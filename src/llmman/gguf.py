"""A fast GGUF header reader: metadata, tensor shapes and capabilities in milliseconds.

The file layout (GGUF spec, ggml/docs/gguf.md; reference/llama-server.md section 8): magic ``GGUF``, u32
version (2 or 3), u64 tensor count, u64 KV count, the KV pairs (u64-length key, u32 value type, value),
the tensor infos (name, u32 n_dims, u64 dims[], u32 ggml type, u64 offset), padding to
``general.alignment`` (default 32), then the tensor data. All little-endian.

Unlike ``gguf.GGUFReader`` (which maps and expands every array element), this reader keeps scalars,
strings and arrays of at most 64 elements, and for bigger arrays (the 150k-entry tokenizer vocabulary)
records only an :class:`ArraySummary` and seeks past the data (string arrays need one 8-byte length read
per element). It stops at the end of the tensor infos. Results are cached by (path, mtime_ns, size).
"""

from __future__ import annotations

import dataclasses
import os
import struct
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any, BinaryIO

from llmman.errors import GGUFError

__all__ = [
    "ArraySummary", "GGUFInfo", "TensorInfo", "clear_cache", "human_number", "merge_split", "model_info",
    "read_array", "read_gguf", "with_capability",
]

MAGIC = b"GGUF"
SMALL_ARRAY = 64  # arrays with at most this many elements are kept as lists
_CHUNK = 1 << 20
_MAX_DIMS = 8
_T_STRING, _T_ARRAY = 8, 9
# GGUF value type -> struct format of one element (GGUF spec "gguf_metadata_value_type").
_SCALARS: dict[int, struct.Struct] = {
    t: struct.Struct("<" + f) for t, f in
    {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}.items()
}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")
# ggml type id -> (name, elements per block, bytes per block)  (ggml/src/ggml.c type_traits).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}
# general.file_type (llama.h enum llama_ftype) -> Ollama's quantization_level string.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}
EMBEDDING_ARCHITECTURES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert", "neo-bert",
     "eurobert", "t5encoder"}
)
_THINKING_MARKERS = ("<think>", "enable_thinking", "reasoning_content", "reasoning_effort", "<|channel|>")
_FIM_KEYS = (("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id"),
             ("tokenizer.ggml.prefix_token_id", "tokenizer.ggml.suffix_token_id"))
CAPABILITY_ORDER = ("completion", "embedding", "tools", "insert", "vision", "thinking")


@dataclass(frozen=True)
class ArraySummary:
    """A big GGUF array that was skipped: element value ``type``, element ``count``, and the file
    ``offset`` (bytes) of its first element, so :func:`read_array` can load it on demand."""

    type: int
    count: int
    offset: int = 0


@dataclass(frozen=True)
class TensorInfo:
    """One tensor info record: name, ggml type id, shape (GGUF order, fastest dim first), data offset."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int

    @property
    def type_name(self) -> str:
        """The ggml type name (``Q4_K``), or ``type<N>`` for an id this reader does not know."""
        known = GGML_TYPES.get(self.ggml_type)
        return known[0] if known else f"type{self.ggml_type}"


@dataclass(frozen=True)
class GGUFInfo:
    """What llmman needs from a GGUF header. Sizes in bytes; lengths in tokens.

    ``quantization`` is Ollama's ``quantization_level`` (``Q4_K_M``; from ``general.file_type``, else the
    most common weight tensor type); ``parameter_count`` is Σ Π dims over the tensors of this file (use
    :func:`merge_split` for split models); ``parameter_size`` is ``general.size_label`` when present, else
    Ollama's human form (``134.52M``, ``7.6B``). ``head_count``/``head_count_kv`` are a tuple when stored per
    layer. ``capabilities`` uses Ollama's names; "vision" is added by the store when an mmproj exists.
    ``metadata`` holds every KV, arrays over 64 elements as :class:`ArraySummary`. ``tensor_bytes`` is the
    tensor data size (file size minus header when a tensor type is unknown); ``file_size`` the file's.
    """

    path: Path
    version: int
    architecture: str
    name: str | None
    basename: str | None
    size_label: str | None
    file_type: int | None
    quantization: str
    parameter_count: int
    parameter_size: str
    context_length: int | None
    embedding_length: int | None
    block_count: int | None
    head_count: int | tuple[int, ...] | None
    head_count_kv: int | tuple[int, ...] | None
    key_length: int | None
    value_length: int | None
    chat_template: str | None
    split_count: int
    capabilities: tuple[str, ...]
    family: str
    metadata: dict[str, object]
    tensor_count: int
    tensor_bytes: int = 0
    file_size: int = 0
    tensors: tuple[TensorInfo, ...] = ()


class _Reader:
    """Forward reader over a file through a 1 MiB window; ``skip`` past the window costs nothing."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self._f, self.size = f, size
        self._buf, self._base, self._off = b"", 0, 0

    def tell(self) -> int:
        return self._base + self._off

    def _fill(self, need: int) -> None:
        pos = self._base + self._off
        if pos + need > self.size:
            raise GGUFError(f"truncated GGUF file: needs {pos + need} bytes, has {self.size}")
        self._f.seek(pos)
        self._buf, self._base, self._off = self._f.read(max(need, _CHUNK)), pos, 0
        if len(self._buf) < need:
            raise GGUFError("truncated GGUF file (short read)")

    def read(self, n: int) -> bytes:
        if self._off + n > len(self._buf):
            self._fill(n)
        data = self._buf[self._off : self._off + n]
        self._off += n
        return data

    def unpack(self, st: struct.Struct) -> tuple[Any, ...]:
        if self._off + st.size > len(self._buf):
            self._fill(st.size)
        value = st.unpack_from(self._buf, self._off)
        self._off += st.size
        return value

    def u32(self) -> int:
        return int(self.unpack(_U32)[0])

    def u64(self) -> int:
        return int(self.unpack(_U64)[0])

    def skip(self, n: int) -> None:
        if self.tell() + n > self.size:
            raise GGUFError(f"truncated GGUF file: needs {self.tell() + n} bytes, has {self.size}")
        self._off += n

    def string(self) -> str:
        n = self.u64()
        if self.tell() + n > self.size:
            raise GGUFError(f"truncated GGUF file: string of {n} bytes at offset {self.tell()}")
        return self.read(n).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        """Walk ``count`` length-prefixed strings: one u64 read per element, in the current window."""
        unpack, buf, off = _U64.unpack_from, self._buf, self._off
        end = len(buf) - 8
        for _ in repeat(None, count):
            if off > end:
                self._off = off
                self._fill(8)
                buf, off = self._buf, 0
                end = len(buf) - 8
            off += 8 + unpack(buf, off)[0]
        self._off = off
        if self.tell() > self.size:
            raise GGUFError("truncated GGUF file inside a string array")


def _value(r: _Reader, vtype: int) -> object:
    st = _SCALARS.get(vtype)
    if st is not None:
        v = r.unpack(st)[0]
        return bool(v) if vtype == 7 else v
    if vtype == _T_STRING:
        return r.string()
    if vtype == _T_ARRAY:
        etype, count = r.u32(), r.u64()
        start = r.tell()
        if count <= SMALL_ARRAY:
            return [_value(r, etype) for _ in range(count)]
        est = _SCALARS.get(etype)
        if est is not None:
            r.skip(count * est.size)
        elif etype == _T_STRING:
            r.skip_strings(count)
        elif etype == _T_ARRAY:
            for _ in range(count):
                _value(r, etype)
        else:
            raise GGUFError(f"unknown GGUF array element type {etype}")
        return ArraySummary(etype, count, start)
    raise GGUFError(f"unknown GGUF value type {vtype}")


def read_array(path: Path, summary: ArraySummary, limit: int | None = None) -> list[object]:
    """Load a skipped array in full, or its first ``limit`` elements (slow for big vocabularies in full:
    use that only for verbose output; e.g. the stop tokens read up to the highest id needed).

    Raises GGUFError when the file no longer holds a readable array at ``summary.offset``.
    """
    count = summary.count if limit is None else max(0, min(limit, summary.count))
    with open(path, "rb") as f:
        r = _Reader(f, os.fstat(f.fileno()).st_size)
        r.skip(summary.offset)
        return [_value(r, summary.type) for _ in range(count)]


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
    info = _parse(Path(path), st.st_size)
    with _cache_lock:
        _cache[key] = info
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return info


def _parse(path: Path, size: int) -> GGUFInfo:
    with open(path, "rb", buffering=0) as f:
        r = _Reader(f, size)
        if size < _HEADER.size:
            raise GGUFError(f"not a GGUF file: {path.name} is only {size} bytes")
        magic, version, n_tensors, n_kv = r.unpack(_HEADER)
        if magic != MAGIC:
            raise GGUFError(f"not a GGUF file: {path.name} (bad magic)")
        assert isinstance(version, int) and isinstance(n_tensors, int) and isinstance(n_kv, int)
        if version not in (2, 3):
            raise GGUFError(f"unsupported GGUF version {version} in {path.name}")
        if n_kv > size // 12 or n_tensors > size // 24:
            raise GGUFError(f"corrupt GGUF header in {path.name}: {n_kv} KVs, {n_tensors} tensors")
        meta: dict[str, object] = {}
        for _ in range(n_kv):
            klen = r.u64()
            if klen > 65535:
                raise GGUFError(f"corrupt GGUF key length {klen} in {path.name}")
            k = r.read(klen).decode("utf-8", errors="replace")
            meta[k] = _value(r, r.u32())
        tensors = []
        for _ in range(n_tensors):
            tname, ndims = r.string(), r.u32()
            if ndims > _MAX_DIMS:
                raise GGUFError(f"corrupt tensor info for {tname!r} in {path.name}: {ndims} dims")
            shape = struct.unpack(f"<{ndims}Q", r.read(8 * ndims))
            tensors.append(TensorInfo(tname, r.u32(), shape, r.u64()))
        align = meta.get("general.alignment", 32)
        align = align if isinstance(align, int) and align > 0 else 32
        data_start = -(-r.tell() // align) * align
    return _describe(path, version, size, meta, tuple(tensors), data_start)


def _tensor_bytes(tensors: Sequence[TensorInfo], size: int, data_start: int, path: Path) -> int:
    total, end = 0, data_start
    for t in tensors:
        kind = GGML_TYPES.get(t.ggml_type)
        if kind is None:
            return max(size - data_start, 0)
        n = 1
        for d in t.shape:
            n *= d
        nbytes = -(-n // kind[1]) * kind[2]
        total += nbytes
        end = max(end, data_start + t.offset + nbytes)
    if end > size:
        raise GGUFError(f"truncated GGUF file: {path.name} tensor data ends at {end}, file has {size} bytes")
    return total


def _int(meta: dict[str, object], key: str) -> int | None:
    v = meta.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _int_or_layers(meta: dict[str, object], key: str) -> int | tuple[int, ...] | None:
    v = meta.get(key)
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return tuple(v)
    return _int(meta, key)


def human_number(n: int) -> str:
    """Ollama's ``format.HumanNumber``: 134515008 -> "134.52M", 7615616512 -> "7.6B", 8e9 -> "8B"."""
    for unit, scale, digits in (("B", 10**9, 1), ("M", 10**6, 2), ("K", 10**3, 0)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.{digits}f}{unit}"
    return str(n)


def _describe(path: Path, version: int, size: int, meta: dict[str, object],
              tensors: tuple[TensorInfo, ...], data_start: int) -> GGUFInfo:
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) else "unknown"
    params = 0
    weights: Counter[int] = Counter()
    for t in tensors:
        n = 1
        for d in t.shape:
            n *= d
        params += n
        if len(t.shape) >= 2:
            weights[t.ggml_type] += n
    file_type = _int(meta, "general.file_type")
    quant = FILE_TYPES.get(file_type) if file_type is not None else None
    if quant is None and weights:
        quant = TensorInfo("", weights.most_common(1)[0][0], (), 0).type_name
    template = meta.get("tokenizer.chat_template")
    label = meta.get("general.size_label")
    name, basename = meta.get("general.name"), meta.get("general.basename")
    info = GGUFInfo(
        path=path, version=version, architecture=arch,
        name=name if isinstance(name, str) else None,
        basename=basename if isinstance(basename, str) else None,
        size_label=label if isinstance(label, str) and label else None,
        file_type=file_type, quantization=quant or "unknown", parameter_count=params,
        parameter_size=label if isinstance(label, str) and label else human_number(params),
        context_length=_int(meta, f"{arch}.context_length"),
        embedding_length=_int(meta, f"{arch}.embedding_length"),
        block_count=_int(meta, f"{arch}.block_count"),
        head_count=_int_or_layers(meta, f"{arch}.attention.head_count"),
        head_count_kv=_int_or_layers(meta, f"{arch}.attention.head_count_kv"),
        key_length=_int(meta, f"{arch}.attention.key_length"),
        value_length=_int(meta, f"{arch}.attention.value_length"),
        chat_template=template if isinstance(template, str) else None,
        split_count=_int(meta, "split.count") or 1, capabilities=(), family=arch, metadata=meta,
        tensor_count=len(tensors), tensor_bytes=_tensor_bytes(tensors, size, data_start, path),
        file_size=size, tensors=tensors,
    )
    return dataclasses.replace(info, capabilities=_capabilities(info))


def _capabilities(info: GGUFInfo) -> tuple[str, ...]:
    meta, caps = info.metadata, set()
    embedding = f"{info.architecture}.pooling_type" in meta or info.architecture in EMBEDDING_ARCHITECTURES
    caps.add("embedding" if embedding else "completion")
    template = info.chat_template or ""
    if "tools" in template:
        caps.add("tools")
    if any(marker in template for marker in _THINKING_MARKERS):
        caps.add("thinking")
    if any(pre in meta and suf in meta for pre, suf in _FIM_KEYS):
        caps.add("insert")
    return tuple(c for c in CAPABILITY_ORDER if c in caps)


def with_capability(info: GGUFInfo, capability: str) -> GGUFInfo:
    """A copy of ``info`` with ``capability`` (e.g. "vision", set by the store for an mmproj) added."""
    caps = set(info.capabilities) | {capability}
    return dataclasses.replace(info, capabilities=tuple(c for c in CAPABILITY_ORDER if c in caps))


def merge_split(infos: Sequence[GGUFInfo]) -> GGUFInfo:
    """Combine the shards of a split GGUF (first shard first): metadata from shard 1, tensor counts,
    parameter count and tensor bytes summed over all shards."""
    first = infos[0]
    if len(infos) == 1:
        return first
    params = sum(i.parameter_count for i in infos)
    return dataclasses.replace(
        first, parameter_count=params, parameter_size=first.size_label or human_number(params),
        tensor_count=sum(i.tensor_count for i in infos), tensor_bytes=sum(i.tensor_bytes for i in infos),
        tensors=tuple(t for i in infos for t in i.tensors),
    )


def model_info(info: GGUFInfo, verbose: bool = False) -> dict[str, object]:
    """Ollama's ``/api/show`` ``model_info`` map (reference/ollama.md 1.10): every GGUF KV, arrays of more
    than 5 elements as ``[]`` unless ``verbose`` (then read in full from the file), without
    ``general.name`` and ``tokenizer.chat_template``, plus ``general.parameter_count``."""
    out: dict[str, object] = {}
    for key, value in info.metadata.items():
        if key in ("general.name", "tokenizer.chat_template"):
            continue
        if isinstance(value, ArraySummary):
            value = read_array(info.path, value) if verbose else []
        elif isinstance(value, list) and len(value) > 5 and not verbose:
            value = []
        out[key] = value
    out["general.parameter_count"] = info.parameter_count
    return out
