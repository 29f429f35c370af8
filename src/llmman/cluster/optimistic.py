"""Optimistic accounting: a peer's view plus the requests this node sent it since the view was fetched.

A peer's ``/llmman/node`` document is fetched every ``aggregation.refresh`` seconds; a burst of requests
decided in between would all see the same figures and pile onto the node that looked idle (llamaMan's
lesson). So each view a decision reads adds, per model, the forwards **this node started after the
fetch was sent and that are still open** (:func:`add_forwards`):

* a forward started before the fetch was sent is in the peer's own figures already (it was counted
  there when the peer answered, or it has finished), so it is not added twice;
* a forward started while the fetch was on the wire may be counted twice (by the peer and here): the
  error leans towards seeing a peer busier than it is, never emptier;
* a forward that has ended is not added (its request left the peer, or will have by the next fetch).

"Started after" is an order, not a time: every forward start and every fetch takes the next number of
one counter (``Peers``), so two events within one clock tick are still ordered.

The added requests fill the model's free slots first (``in_flight``) and wait after that (``queued``),
as the peer itself counts them (cluster/state.py ``model_loads``). A model still loading has no slots
yet: every added request waits. A model the view does not show loaded is what a forward makes the peer
load (or copy), so it appears as loading, its weights counted at ``size`` like the peer's own estimate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from llmman.cluster.placement import ModelLoad, NodeView


def plus(load: ModelLoad, requests: int) -> ModelLoad:
    """``load`` with ``requests`` more: into free slots first, then the queue; all queued while loading.
    Unknown slots (0, an older node) take every request as served."""
    if requests <= 0:
        return load
    if load.loading:
        return dataclasses.replace(load, queued=load.queued + requests)
    busy = load.busy + requests
    served = min(busy, load.slots) if load.slots else load.in_flight + requests
    return dataclasses.replace(load, in_flight=served, queued=busy - served)


def _key(table: Mapping[str, object], ref: str) -> str | None:
    """The key of ``table`` naming ``ref`` (case-insensitive), or None."""
    low = ref.lower()
    return next((k for k in table if k.lower() == low), None)


def add_forwards(view: NodeView, forwards: Mapping[str, int], sizes: Mapping[str, int]) -> NodeView:
    """``view`` with ``forwards`` (reference -> open forwards started after the fetch) added to its
    models; ``sizes`` gives a model's weight bytes (any case) for one the view does not show loaded.
    The same view is returned when nothing is added."""
    extra = {ref: n for ref, n in forwards.items() if n > 0}
    if not extra:
        return view
    loaded, models = dict(view.loaded), dict(view.models)
    for ref, n in extra.items():
        key = _key(models, ref)
        if key is not None:
            models[key] = plus(models[key], n)
            continue
        key = _key(loaded, ref)
        if key is not None:  # loaded, but an older node says nothing of its load
            models[key] = plus(ModelLoad(), n)
            continue
        size_key = _key(sizes, ref)
        loaded[ref] = sizes[size_key] if size_key is not None else 0
        models[ref] = plus(ModelLoad(loading=True), n)
    return dataclasses.replace(view, loaded=loaded, models=models)
