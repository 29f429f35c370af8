"""The shapes a GGUF header is read into, and the ggml/llama.cpp type tables they are named by."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
