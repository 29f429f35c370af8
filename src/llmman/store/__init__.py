"""llmman's OCI image-layout model store: :class:`Store` and the records it returns.

See :mod:`llmman.store.catalog` (index entries), :mod:`llmman.store.layout` (blobs, lock, atomic writes),
:mod:`llmman.store.build` (packaging local GGUFs), :mod:`llmman.store.files` (paths for llama-server),
:mod:`llmman.store.derive` (derived models: system prompt, parameters, messages, licenses).
"""

from __future__ import annotations

from llmman.store.catalog import BlobCheck, Store, stored_name
from llmman.store.derive import ModelExtras, derive_model, read_extras
from llmman.store.model import ModelFiles, StoredModel, layer_filename, layer_role

__all__ = [
    "BlobCheck", "ModelExtras", "ModelFiles", "Store", "StoredModel", "derive_model", "layer_filename",
    "layer_role", "read_extras", "stored_name",
]
