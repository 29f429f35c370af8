"""Aggregation (SPEC G): several ``llmman serve`` daemons pooling their hardware.

:mod:`.peers` parses the peer list and probes ``GET /llmman/node``; :mod:`.placement` is the pure
choice of a node; :mod:`.forward` sends a request on to a peer; :mod:`.views` merges list answers;
:mod:`.copy` fetches a model from a peer's ``/v2/`` registry. See docs/aggregation.md.
"""
