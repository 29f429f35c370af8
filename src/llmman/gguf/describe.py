"""From a parsed GGUF header to what llmman shows and plans with: architecture, sizes, quantization,
Ollama's capability names and ``/api/show`` ``model_info`` (Ollama's ``api.ShowResponse``)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from llmman.errors import GGUFError
from llmman.gguf.reader import RawHeader, read_array
from llmman.gguf.types import FILE_TYPES, GGML_TYPES, ArraySummary, GGUFInfo, TensorInfo

EMBEDDING_ARCHITECTURES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert", "neo-bert",
     "eurobert", "t5encoder"}
)
_THINKING_MARKERS = ("<think>", "enable_thinking", "reasoning_content", "reasoning_effort", "<|channel|>")
_FIM_KEYS = (("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id"),
             ("tokenizer.ggml.prefix_token_id", "tokenizer.ggml.suffix_token_id"))
CAPABILITY_ORDER = ("completion", "embedding", "tools", "insert", "vision", "thinking")


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


def describe(path: Path, size: int, raw: RawHeader) -> GGUFInfo:
    """The :class:`GGUFInfo` of a parsed header; ``size`` is the file's size in bytes.

    Raises GGUFError when the tensor data would end past the end of the file (a truncated download).
    """
    version, meta, tensors, data_start = raw
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
    """Ollama's ``/api/show`` ``model_info`` map (as its ShowHandler builds it): every GGUF KV, arrays of more
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
