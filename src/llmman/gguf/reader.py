"""The binary walk over a GGUF header (GGUF spec, ggml/docs/gguf.md): KV pairs and tensor infos.

Arrays of more than 64 elements are not expanded: an :class:`ArraySummary` records where they are,
and :func:`read_array` loads one on demand. The walk stops at the end of the tensor infos.
"""

from __future__ import annotations

import os
import struct
from itertools import repeat
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from llmman.errors import GGUFError
from llmman.gguf.types import ArraySummary, TensorInfo

MAGIC = b"GGUF"
SMALL_ARRAY = 64  # arrays with at most this many elements are kept as lists
#: Arrays nested deeper than this are a corrupt or hostile header (real GGUFs nest at most 2: llama.cpp's
#: own reader refuses arrays of arrays); the walk is recursive, so 20 000 levels were a RecursionError.
MAX_ARRAY_DEPTH = 8
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


class RawHeader(NamedTuple):
    """What :func:`parse_header` found: GGUF ``version``, the KV ``meta`` (big arrays as
    :class:`ArraySummary`), the tensor infos, and ``data_start``, the byte offset of the tensor data."""

    version: int
    meta: dict[str, object]
    tensors: tuple[TensorInfo, ...]
    data_start: int


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


def _value(r: _Reader, vtype: int, depth: int = 0) -> object:
    st = _SCALARS.get(vtype)
    if st is not None:
        v = r.unpack(st)[0]
        return bool(v) if vtype == 7 else v
    if vtype == _T_STRING:
        return r.string()
    if vtype == _T_ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise GGUFError(f"corrupt GGUF header: arrays nested more than {MAX_ARRAY_DEPTH} deep at offset "
                            f"{r.tell()}")
        etype, count = r.u32(), r.u64()
        start = r.tell()
        if count <= SMALL_ARRAY:
            return [_value(r, etype, depth + 1) for _ in range(count)]
        est = _SCALARS.get(etype)
        if est is not None:
            r.skip(count * est.size)
        elif etype == _T_STRING:
            r.skip_strings(count)
        elif etype == _T_ARRAY:
            for _ in range(count):
                _value(r, etype, depth + 1)
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


def parse_header(path: Path, size: int) -> RawHeader:
    """Read the KV pairs and tensor infos of the GGUF file at ``path`` (``size`` bytes).

    Raises:
        GGUFError: bad magic, version other than 2/3, truncated header, unknown value type, absurd counts.
        OSError: the file cannot be opened.
    """
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
    return RawHeader(version, meta, tuple(tensors), data_start)
