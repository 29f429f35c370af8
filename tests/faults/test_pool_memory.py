"""What a node remembers per request stays bounded whatever clients send.

A client can name any model (a typo, a model no node has, ten thousand made-up names) and open any
number of conversations: the router's memories of local placements (llmman.cluster.replicas.LocalPending)
and of conversations (llmman.cluster.affinity.Affinity) must not grow with them.
"""

from __future__ import annotations

from llmman.cluster.affinity import SIZE, Affinity
from llmman.cluster.replicas import LocalPending


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_placements_of_names_requested_once_are_not_held() -> None:
    clock = Clock()
    pending = LocalPending(window=1.0, clock=clock)
    for i in range(10_000):  # one request per made-up name, 10 ms apart (no event loop: window only)
        pending.placed(f"docker.io/ai/nosuch{i}:latest", 0)
        clock.now += 0.01
    assert len(pending) <= 101  # the last window's names only (each placed one is dropped a second on)
    assert pending.busy("docker.io/ai/nosuch9999:latest", 0) == 1


def test_ten_thousand_conversations_keep_the_affinity_bounded() -> None:
    clock = Clock()
    affinity = Affinity(ttl=300.0, clock=clock)
    for i in range(10_000):
        affinity.put(f"conversation-{i}", "local")
    assert len(affinity) == SIZE
    assert affinity.get("conversation-9999") == "local" and affinity.get("conversation-0") is None
