"""``llmman import``: the models a user already has (Ollama's store, the Hugging Face cache, llama.cpp's
cache, LM Studio's folder, any folder of GGUFs) into the store without a second copy of their weights.

:mod:`~llmman.store.imports.discover` finds them (recognisers: :mod:`~llmman.store.imports.ollama`,
:mod:`~llmman.store.imports.hfcache`, :mod:`~llmman.store.imports.ggufdir`, names in
:mod:`~llmman.store.imports.found`), :mod:`~llmman.store.imports.importer` imports them,
:mod:`~llmman.store.imports.adopt` links their files. docs/store.md says how an imported blob is held
and verified; docs/compatibility.md what a user sees.
"""

from __future__ import annotations

from llmman.store.imports.discover import discover, discover_sources, sources_of
from llmman.store.imports.found import Found, Part
from llmman.store.imports.importer import Outcome, import_all, import_found

__all__ = ["Found", "Outcome", "Part", "discover", "discover_sources", "import_all", "import_found",
           "sources_of"]
