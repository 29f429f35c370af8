"""Tiny synthetic GGUF files for tests and benchmarks, written with gguf-py's ``GGUFWriter``.

Every helper returns the path(s) it wrote. Tensors are small (a few KiB) so files stay tiny; the
``vocab`` option adds a tokenizer of that many tokens (strings), scores (f32) and token types (i32),
optionally with as many merges, placed before the chat template as real converters do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)
TOOLS_THINK_TEMPLATE = (
    "{% if tools %}{{ tools | tojson }}{% endif %}{% if enable_thinking %}<think>{% endif %}"
    + CHATML_TEMPLATE
)

# name -> shape in numpy order (slowest dim first); GGUF stores it reversed.
DEFAULT_TENSORS: dict[str, tuple[int, ...]] = {
    "token_embd.weight": (64, 32),
    "blk.0.attn_norm.weight": (32,),
    "blk.0.attn_q.weight": (32, 32),
    "blk.0.ffn_up.weight": (64, 32),
    "output_norm.weight": (32,),
}


def _vocab_tokens(n: int) -> list[str]:
    return [f"tok{i}" for i in range(n)]


def write_gguf(
    path: Path,
    *,
    arch: str = "llama",
    name: str | None = "Tiny Test",
    size_label: str | None = None,
    file_type: int | None = 3,
    context_length: int | None = 2048,
    block_count: int = 1,
    head_count: int = 4,
    head_count_kv: int | Sequence[int] = 2,
    chat_template: str | None = CHATML_TEMPLATE,
    vocab: int = 0,
    merges: int = 0,
    tensors: Mapping[str, tuple[int, ...]] | None = None,
    q8_tensor: bool = True,
    extra: Mapping[str, object] | None = None,
) -> Path:
    """Write a small single-file GGUF model; returns ``path``.

    ``file_type`` is ``general.file_type`` (3 = Q4_1; None leaves it out). ``extra`` adds KVs: str, bool,
    int (written as u32), float (f32) or list[int] (i32 array). ``q8_tensor`` adds one 64x32 Q8_0 tensor.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), arch)
    if name is not None:
        w.add_name(name)
    if size_label is not None:
        w.add_size_label(size_label)
    if file_type is not None:
        w.add_file_type(file_type)
    if context_length is not None:
        w.add_context_length(context_length)
    w.add_embedding_length(32)
    w.add_block_count(block_count)
    w.add_head_count(head_count)
    if isinstance(head_count_kv, int):
        w.add_head_count_kv(head_count_kv)
    else:
        w.add_array(f"{arch}.attention.head_count_kv", list(head_count_kv))
    w.add_key_length(8)
    w.add_value_length(8)
    if vocab:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(_vocab_tokens(vocab))
        w.add_token_scores([0.0] * vocab)
        w.add_token_types([1] * vocab)
        if merges:
            w.add_token_merges([f"t{i} k{i}" for i in range(merges)])
    for key, value in (extra or {}).items():
        _add(w, key, value)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    for tname, shape in (DEFAULT_TENSORS if tensors is None else tensors).items():
        w.add_tensor(tname, np.ones(shape, dtype=np.float32))
    if q8_tensor:
        raw = np.zeros((64, 32 // 32 * 34), dtype=np.uint8)  # 64 rows of one Q8_0 block (34 bytes)
        w.add_tensor("blk.0.attn_k.weight", raw, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add(w: GGUFWriter, key: str, value: object) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, list):
        w.add_array(key, value)
    else:
        raise TypeError(f"unsupported test KV {key}={value!r}")


def write_split(folder: Path, prefix: str = "model", count: int = 2, **kwargs: object) -> list[Path]:
    """Write ``count`` shards ``<prefix>-0000k-of-0000n.gguf`` in ``folder`` (llama.cpp gguf-split naming):
    shard 1 carries the metadata, every shard carries ``split.no``/``split.count``/``split.tensors.count``
    and two tensors. Returns the shard paths in order."""
    paths = []
    for k in range(count):
        tensors = {f"blk.{k}.a.weight": (8, 32), f"blk.{k}.b.weight": (32,)}
        extra = {"split.no": k, "split.count": count, "split.tensors.count": 2 * count}
        p = folder / f"{prefix}-{k + 1:05d}-of-{count:05d}.gguf"
        opts: dict[str, object] = dict(kwargs) if k == 0 else {"name": None, "chat_template": None}
        write_gguf(p, tensors=tensors, q8_tensor=False, extra=extra, **opts)  # type: ignore[arg-type]
        paths.append(p)
    return paths


def write_mmproj(path: Path) -> Path:
    """Write a tiny vision projector: ``general.architecture = clip``."""
    return write_gguf(path, arch="clip", name="Tiny mmproj", file_type=1, context_length=None,
                      chat_template=None, tensors={"v.patch_embd.weight": (16, 16)}, q8_tensor=False)
