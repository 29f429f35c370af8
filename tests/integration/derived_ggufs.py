"""Copies of the real SmolLM2-135M GGUF with one more metadata key, for what neither test model has.

* ``smollm2-fim:135m``: FIM token ids (``tokenizer.ggml.fim_pre/suf/mid_token_id``) naming three of
  SmolLM2's own control tokens (``<repo_name>``, ``<reponame>``, ``<file_sep>``), so llama-server's
  ``/infill`` runs on it and llmman shows the ``insert`` capability. The weights never learnt those tokens
  as FIM markers: its answers are real generation, not good completions.
* ``smollm2-rerank:135m``: ``llama.pooling_type`` ``rank`` (4), so llama-server started with
  ``--pooling rank`` ranks documents with it (scores from SmolLM2's output head, not a trained reranker).
"""

from __future__ import annotations

from pathlib import Path

FIM_NAME = "smollm2-fim:135m"
RERANK_NAME = "smollm2-rerank:135m"
_FIM_TOKENS = {"tokenizer.ggml.fim_pre_token_id": 3, "tokenizer.ggml.fim_suf_token_id": 4,
               "tokenizer.ggml.fim_mid_token_id": 5}


def _copy_with(source: Path, target: Path, values: dict[str, int]) -> Path:
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(str(source))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    assert arch is not None
    writer = gguf.GGUFWriter(str(target), arch=str(arch.contents()), endianess=reader.endianess)
    new = {key: MetadataDetails(gguf.GGUFValueType.UINT32, value) for key, value in values.items()}
    copy_with_new_metadata(reader, writer, new, [])
    return target


def write_fim_model(source: Path, target: Path) -> Path:
    """Copy the SmolLM2 GGUF ``source`` to ``target`` with FIM token ids."""
    return _copy_with(source, target, _FIM_TOKENS)


def write_rerank_model(source: Path, target: Path) -> Path:
    """Copy the SmolLM2 GGUF ``source`` to ``target`` with the ``rank`` pooling type."""
    return _copy_with(source, target, {"llama.pooling_type": 4})
