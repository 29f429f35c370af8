"""``llmman verify``: hash every blob of the store (or of the named models), report the bad ones, and with
``repair`` fetch them again from each model's registry (docs/store.md).

:func:`verify_store` emits Ollama-style NDJSON lines, the same from the daemon (``POST /api/verify``) and
from the CLI working on the store directly:

* ``{"status": "ok"|"corrupt"|"missing", "digest", "size", "models"}`` per blob (a corrupt blob has been
  removed from the store: under its name it could only be wrong);
* with ``repair``, per model that lost a blob: ``{"status": "repairing <name>"}``, the pull's progress
  lines, then ``{"status": "repaired <name>"}`` or ``{"status": "not repaired <name>", "error": …}``;
* last ``{"status": "done", "checked", "bad", "repaired"}``: ``bad`` counts the blobs still bad.

A model is repaired by pulling its stored manifest digest (``name@sha256:…``; a Hugging Face model by its
tag) through the :class:`Puller`, which fetches only what is missing and verifies it; offline rules apply.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from llmman.errors import LlmmanError
from llmman.refs import HF_REGISTRY, Reference, parse_reference
from llmman.registry.puller import Emit, Puller
from llmman.store import BlobCheck, Store

__all__ = ["verify_store"]


def _line(check: BlobCheck) -> dict[str, object]:
    return {"status": check.state, "digest": check.digest, "size": check.size, "models": list(check.models)}


def verify_store(store: Store, refs: Iterable[Reference] | None, emit: Emit, *, repair: bool = False,
                 puller: Puller | None = None) -> int:
    """Check (and with ``repair`` and a ``puller``, repair) the blobs; returns how many are still bad.

    Raises ModelNotFound for a ref that names no stored model (before anything is checked)."""
    wanted = list(refs) if refs is not None else None
    entries = store.entries(wanted)
    results = store.check(wanted, on_blob=lambda c: emit(_line(c)))
    bad = [c for c in results if c.state != "ok"]
    repaired = 0
    if repair and bad and puller is not None:
        broken = sorted({name for c in bad for name in c.models})
        digests = dict(entries)
        fixed: list[str] = []
        for name in broken:
            emit({"status": f"repairing {name}"})
            try:
                ref = parse_reference(name)
                if ref.registry != HF_REGISTRY:
                    ref = replace(ref, digest=digests[name])
                puller.pull(ref, lambda line: emit(line) if line.get("status") != "success" else None)
            except (LlmmanError, OSError) as exc:
                emit({"status": f"not repaired {name}", "error": str(exc)})
                continue
            fixed.append(name)
            emit({"status": f"repaired {name}"})
        if fixed:
            again = {c.digest: c for c in store.check([parse_reference(n) for n in fixed])}
            repaired = sum(1 for c in bad if c.digest in again and again[c.digest].state == "ok")
    remaining = len(bad) - repaired
    emit({"status": "done", "checked": len(results), "bad": remaining, "repaired": repaired})
    return remaining
