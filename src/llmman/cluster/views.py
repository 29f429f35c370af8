"""One view of the aggregation: list answers (``/api/ps``, ``/api/tags``, ``/v1/models``) merged.

This node's entries come first. When peers contribute, every entry names its node (``local`` or
``host:port``), which is what makes ``llmman ps`` show its NODE column. ``/api/ps`` keeps every entry
(a model is loaded on one node); ``/api/tags`` and ``/v1/models`` list a model stored on several nodes
once, at the first node that has it.
"""

from __future__ import annotations

from typing import Any

from llmman.cluster.placement import LOCAL

MERGED = {"/api/ps": ("models", "name", False), "/api/tags": ("models", "name", True),
          "/v1/models": ("data", "id", True)}


def merge(path: str, local: Any, remote: list[tuple[str, Any]]) -> Any:
    """``local``'s document with the peers' entries appended.

    Args:
        path: one of :data:`MERGED`.
        local: this node's answer (a dict holding the list).
        remote: ``(peer name, its answer)`` for each peer that answered.
    """
    field, id_key, dedupe = MERGED[path]
    if not isinstance(local, dict) or not isinstance(local.get(field), list):
        return local
    entries: list[Any] = list(local[field])
    seen = {e.get(id_key) for e in entries if isinstance(e, dict)}
    added = False
    for name, doc in remote:
        items = doc.get(field) if isinstance(doc, dict) else None
        if not isinstance(items, list):
            continue
        for item in items:
            if not isinstance(item, dict) or (dedupe and item.get(id_key) in seen):
                continue
            seen.add(item.get(id_key))
            entries.append({**item, "node": name})
            added = True
    if added:
        entries = [e if not isinstance(e, dict) or "node" in e else {**e, "node": LOCAL} for e in entries]
    return {**local, field: entries}
