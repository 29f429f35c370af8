"""The fast GGUF header reader (llmman.gguf) against files written by gguf-py."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import gguf as ggufpy
import pytest
from ggufgen import TOOLS_THINK_TEMPLATE, write_gguf, write_mmproj, write_split
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmman.errors import GGUFError
from llmman.gguf import (
    FILE_TYPES,
    GGML_TYPES,
    ArraySummary,
    human_number,
    merge_split,
    model_info,
    read_gguf,
)

SMOLLM = Path.home() / ".cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def big_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("big") / "big.gguf", vocab=150_000, merges=1000)


def test_reads_synthetic_model_fields(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", vocab=100)
    info = read_gguf(path)
    assert info.path == path and info.version == 3
    assert info.architecture == info.family == "llama"
    assert info.name == "Tiny Test" and info.basename is None and info.size_label is None
    assert info.file_type == 3 and info.quantization == "Q4_1"
    # 64*32 + 32 + 32*32 + 64*32 + 32 (F32) + 64*32 (Q8_0)
    assert info.parameter_count == 2048 + 32 + 1024 + 2048 + 32 + 2048
    assert info.parameter_size == human_number(info.parameter_count) == "7K"
    assert (info.context_length, info.embedding_length, info.block_count) == (2048, 32, 1)
    assert (info.head_count, info.head_count_kv, info.key_length, info.value_length) == (4, 2, 8, 8)
    assert info.chat_template is not None and "<|im_start|>" in info.chat_template
    assert info.split_count == 1 and info.capabilities == ("completion",)
    assert info.tensor_count == 6
    assert info.tensor_bytes == (2048 + 32 + 1024 + 2048 + 32) * 4 + 64 * 34
    tokens = info.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, ArraySummary) and (tokens.type, tokens.count) == (8, 100) and tokens.offset > 0
    assert info.metadata["general.file_type"] == 3


def test_matches_gguf_py_reader(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", vocab=10, extra={"llama.rope.freq_base": 10000.0, "x.flag": True})
    ours = read_gguf(path)
    ref = ggufpy.GGUFReader(path)
    assert ours.tensor_count == len(ref.tensors)
    for mine, theirs in zip(ours.tensors, ref.tensors, strict=True):
        assert mine.name == theirs.name
        assert mine.shape == tuple(int(d) for d in theirs.shape)
        assert mine.ggml_type == int(theirs.tensor_type)
        assert mine.type_name == theirs.tensor_type.name
    assert set(ours.metadata) == {k for k in ref.fields if not k.startswith("GGUF.")}
    for key in ("general.architecture", "llama.context_length", "llama.rope.freq_base", "x.flag"):
        assert ours.metadata[key] == ref.fields[key].contents()
    assert ours.metadata["tokenizer.ggml.tokens"] == [f"tok{i}" for i in range(10)]  # small: kept


def test_type_tables_agree_with_gguf_py() -> None:
    for qtype, (block, size) in ggufpy.GGML_QUANT_SIZES.items():
        assert GGML_TYPES[int(qtype)] == (qtype.name, block, size)
    for ftype in ggufpy.LlamaFileType:
        if ftype.name != "GUESSED":
            assert FILE_TYPES[ftype.value] == ftype.name.removeprefix("ALL_").removeprefix("MOSTLY_")


def test_skips_huge_vocabulary_and_reads_what_follows(big_vocab: Path) -> None:
    info = read_gguf(big_vocab)
    tokens = info.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, ArraySummary) and (tokens.type, tokens.count) == (8, 150_000)
    scores = info.metadata["tokenizer.ggml.scores"]
    assert isinstance(scores, ArraySummary) and (scores.type, scores.count) == (6, 150_000)
    merges = info.metadata["tokenizer.ggml.merges"]
    assert isinstance(merges, ArraySummary) and merges.count == 1000
    assert info.chat_template is not None  # stored after the arrays
    assert info.tensor_count == 6


def test_model_info_shape(tmp_path: Path) -> None:
    extra = {"x.short": [1, 2, 3], "x.long": [1, 2, 3, 4, 5, 6]}
    path = write_gguf(tmp_path / "m.gguf", vocab=100, extra=extra)
    info = read_gguf(path)
    mi = model_info(info)
    assert "general.name" not in mi and "tokenizer.chat_template" not in mi
    assert mi["general.parameter_count"] == info.parameter_count
    assert mi["general.architecture"] == "llama" and mi["llama.context_length"] == 2048
    assert mi["tokenizer.ggml.tokens"] == [] and mi["x.long"] == [] and mi["x.short"] == [1, 2, 3]
    verbose = model_info(info, verbose=True)
    assert verbose["tokenizer.ggml.tokens"] == [f"tok{i}" for i in range(100)]
    assert verbose["tokenizer.ggml.scores"] == [0.0] * 100
    assert verbose["x.long"] == [1, 2, 3, 4, 5, 6]


def test_size_label_and_per_layer_heads(tmp_path: Path) -> None:
    info = read_gguf(write_gguf(tmp_path / "m.gguf", size_label="135M", head_count_kv=[2, 4], block_count=2))
    assert info.parameter_size == "135M" and info.size_label == "135M"
    assert info.head_count_kv == (2, 4)


def test_quantization_falls_back_to_most_common_weight_type(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", file_type=None, tensors={"norm.weight": (32,)})
    info = read_gguf(path)
    assert info.file_type is None and info.quantization == "Q8_0"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"chat_template": TOOLS_THINK_TEMPLATE}, ("completion", "tools", "thinking")),
        ({"extra": {"llama.pooling_type": 1}}, ("embedding",)),
        ({"arch": "bert", "chat_template": None}, ("embedding",)),
        ({"extra": {"tokenizer.ggml.fim_pre_token_id": 1, "tokenizer.ggml.fim_suf_token_id": 2}},
         ("completion", "insert")),
        ({"chat_template": None}, ("completion",)),
    ],
)
def test_capabilities(tmp_path: Path, kwargs: dict[str, object], expected: tuple[str, ...]) -> None:
    assert read_gguf(write_gguf(tmp_path / "m.gguf", **kwargs)).capabilities == expected  # type: ignore[arg-type]


def test_mmproj_and_split_metadata(tmp_path: Path) -> None:
    assert read_gguf(write_mmproj(tmp_path / "mmproj.gguf")).architecture == "clip"
    shards = write_split(tmp_path / "split", count=3)
    infos = [read_gguf(p) for p in shards]
    assert [i.split_count for i in infos] == [3, 3, 3]
    merged = merge_split(infos)
    assert merged.parameter_count == 3 * (8 * 32 + 32) and merged.tensor_count == 6
    assert merged.chat_template == infos[0].chat_template


def test_cache_by_path_mtime_size(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", context_length=2048)
    first = read_gguf(path)
    assert read_gguf(path) is first
    write_gguf(path, context_length=4096, name="Other name")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert read_gguf(path).context_length == 4096


def test_human_number() -> None:
    assert human_number(134_515_008) == "134.52M"
    assert human_number(7_615_616_512) == "7.6B"
    assert human_number(8_000_000_000) == "8B"
    assert human_number(270_000_000) == "270M"
    assert human_number(999) == "999"


@pytest.mark.parametrize(
    "data",
    [b"", b"GGU", b"not a gguf file at all, just text" * 4, b"GGUF" + struct.pack("<IQQ", 7, 0, 0),
     b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99)],
    ids=["empty", "short", "junk", "version", "value-type"],
)
def test_rejects_junk(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFError):
        read_gguf(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fraction=st.floats(min_value=0.0, max_value=0.999))
def test_any_truncation_raises_gguf_error(tmp_path: Path, fraction: float) -> None:
    source = tmp_path / "whole.gguf"
    if not source.exists():
        write_gguf(source, vocab=200)
    data = source.read_bytes()
    cut = tmp_path / f"cut-{fraction}.gguf"
    cut.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(GGUFError):
        read_gguf(cut)


@pytest.mark.skipif(not SMOLLM.exists(), reason="SmolLM2 model file not downloaded")
def test_real_smollm2() -> None:
    info = read_gguf(SMOLLM)
    assert info.architecture == "llama" and info.context_length == 8192
    assert info.quantization == "Q4_1" and info.chat_template
    assert info.parameter_size.startswith(("135M", "134"))
    assert 130_000_000 < info.parameter_count < 140_000_000
    tokens = info.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, ArraySummary) and tokens.count == 49152
