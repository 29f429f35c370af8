"""``store.scan_dirs`` (``LLMMAN_MODELS_DIRS``): the folders whose models a daemon imports at start, as
llama-server's router mode reads ``--models-dir``.

The daemon runs :func:`import_scan_dirs` in a background thread once it starts (it answers meanwhile;
a model appears in ``/api/tags`` as soon as it is imported). Each entry is a folder or a keyword of
``llmman import``; a folder that does not exist is logged and skipped. The import is ``llmman import``'s
(:func:`llmman.store.imports.import_all`): idempotent, so every start re-checks the same folders cheaply
(a stat per file already linked; files that do not name their digest are hashed again).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from llmman.config.model_dirs import ModelDirs
from llmman.errors import LlmmanError
from llmman.store.catalog import Store
from llmman.store.imports.discover import discover_sources, sources_of
from llmman.store.imports.importer import Outcome, import_all

__all__ = ["import_scan_dirs"]

log = logging.getLogger("llmman.import")


def import_scan_dirs(store: Store, entries: Sequence[str], dirs: ModelDirs) -> list[Outcome]:
    """Import every model of ``entries`` (folders or keywords) into ``store``, logging each result and a
    summary; never raises (a failure is logged)."""
    outcomes: list[Outcome] = []
    for entry in entries:
        try:
            sources = sources_of([entry], dirs)
            if not any(path.exists() for path, _ in sources):
                log.warning("store.scan_dirs: %s does not exist; skipped", entry)
                continue
            outcomes += import_all(store, discover_sources(sources), on_outcome=_log)
        except LlmmanError as exc:
            log.warning("store.scan_dirs: %s: %s", entry, exc.message)
        except Exception:
            log.exception("store.scan_dirs: %s: the import failed", entry)
    counts = {s: sum(o.state == s for o in outcomes) for s in ("imported", "updated", "unchanged",
                                                               "skipped", "failed")}
    log.info("store.scan_dirs: %s", ", ".join(f"{n} {s}" for s, n in counts.items()))
    return outcomes


def _log(outcome: Outcome) -> None:
    if outcome.state in ("skipped", "failed"):
        log.warning("store.scan_dirs: %s %s (%s): %s", outcome.state, outcome.name, outcome.source,
                    outcome.detail)
    elif outcome.state != "unchanged":
        log.info("store.scan_dirs: %s %s from %s (%s)", outcome.state, outcome.name, outcome.source,
                 outcome.how)
