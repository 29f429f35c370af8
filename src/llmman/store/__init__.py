"""llmman's OCI image-layout model store: :class:`Store` and the records it returns.

See :mod:`llmman.store.catalog` (index entries), :mod:`llmman.store.layout` (blobs, lock, atomic writes),
:mod:`llmman.store.build` (packaging local GGUFs), :mod:`llmman.store.files` (paths for llama-server).
"""

from __future__ import annotations

from llmman.store.catalog import Store, stored_name
from llmman.store.model import ModelFiles, StoredModel, layer_filename, layer_role

__all__ = ["ModelFiles", "Store", "StoredModel", "layer_filename", "layer_role", "stored_name"]
