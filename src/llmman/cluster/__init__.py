"""Aggregation (docs/aggregation.md): several ``llmman serve`` daemons pooling their hardware.

:mod:`.router` decides where each request runs (this node, copying from a peer, or forwarded to an
ordered list of peers); :mod:`.placement` is its pure ranking of nodes; :mod:`.peers` parses the peer
list and probes ``GET /llmman/node``; :mod:`.recent` remembers briefly where models were seen loaded;
:mod:`.source` checks the copy source a forwarded request names; :mod:`.forward` sends a request on to a
peer; :mod:`.views` merges list answers; :mod:`.copy` fetches a model from a peer's ``/v2/`` registry.
See docs/architecture.md.
"""
