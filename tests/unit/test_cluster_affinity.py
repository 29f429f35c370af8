"""The placement memories (cluster/affinity.py, cluster/replicas.py) and the conversation key
(protocol/conversation.py), on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from llmman.cluster.affinity import Affinity
from llmman.cluster.replicas import LocalPending, Saturation
from llmman.protocol.conversation import conversation_key


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_affinity_expires_after_its_ttl_and_forgets_the_least_recently_set_first() -> None:
    clock = Clock()
    memory = Affinity(ttl=10, size=2, clock=clock)
    memory.put("a", "local")
    memory.put("b", "spark:17434")
    assert memory.get("a") == "local"
    memory.put("c", "local")  # full: "a" was set first
    assert (memory.get("a"), memory.get("b"), memory.get("c")) == (None, "spark:17434", "local")
    assert len(memory) == 2
    clock.now += 9
    memory.put("c", "asahi:17434")  # a new turn sets the node and the time again
    clock.now += 2
    assert (memory.get("b"), memory.get("c")) == (None, "asahi:17434")
    forever = Affinity(ttl=0, clock=clock)
    forever.put("a", "local")
    clock.now += 10**6
    assert forever.get("a") == "local"


def test_saturation_is_due_only_after_an_unbroken_period() -> None:
    clock = Clock()
    seen = Saturation(clock)
    assert not seen.observe("M", True, 2)
    clock.now += 1.9
    assert not seen.observe("m", True, 2)
    clock.now += 0.1
    assert seen.observe("M", True, 2)
    assert not seen.observe("M", False, 2)
    assert not seen.observe("M", True, 2)  # the period starts over
    assert Saturation(clock).observe("M", True, 0)  # replica_after 0: at once


def test_local_pending_counts_a_burst_until_the_scheduler_shows_it() -> None:
    clock = Clock()
    pending = LocalPending(window=0.5, clock=clock)
    assert pending.busy("M", 3) == 3
    for _ in range(5):  # a burst: the scheduler still says 3
        pending.placed("M", pending_reported := 3)
    assert pending.busy("m", pending_reported) == 8
    assert pending.busy("M", 9) == 9  # the scheduler caught up (and more)
    clock.now += 0.3
    pending.placed("M", 9)
    assert pending.busy("M", 4) == 10  # the earlier burst, then one more on top of the 9 seen
    clock.now += 0.3  # the burst's window is over: the one placement seen at 9 is left
    assert pending.busy("M", 4) == 10
    clock.now += 0.3
    assert pending.busy("M", 4) == 4
    assert pending.busy("other", 0) == 0


SYSTEM = {"role": "system", "content": "Be brief."}
HI = {"role": "user", "content": "hi"}


def test_the_key_stays_the_same_as_the_conversation_grows() -> None:
    first = conversation_key("smollm2", [SYSTEM, HI])
    later = conversation_key("smollm2", [SYSTEM, HI, {"role": "assistant", "content": "Hello!"},
                                         {"role": "user", "content": "and then?"}])
    assert first is not None and first == later and len(first) == 64


@pytest.mark.parametrize(("one", "other"), [
    (("smollm2", [SYSTEM, HI]), ("gemma", [SYSTEM, HI])),
    (("m", [SYSTEM, HI]), ("m", [HI])),
    (("m", [HI]), ("m", [{"role": "user", "content": "hello"}])),
    (("m", [HI], "Be brief."), ("m", [HI], "Be long.")),
])
def test_the_key_changes_with_the_model_the_system_prompt_or_the_first_message(
        one: tuple[object, ...], other: tuple[object, ...]) -> None:
    assert conversation_key(*one) != conversation_key(*other)  # type: ignore[arg-type]


def test_the_key_reads_every_dialects_shape() -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert conversation_key("m", parts) is not None
    assert conversation_key("m", "hi") == conversation_key("m", [HI])  # Responses' input as a string
    responses = [{"type": "message", "role": "developer", "content": "x"}, {"type": "message", **HI}]
    developer = {"role": "developer", "content": "x"}
    assert conversation_key("m", responses) == conversation_key("m", [developer, HI])
    assert conversation_key("m", [SYSTEM]) is None  # nothing to continue
    assert conversation_key("m", None) is None
    assert conversation_key("m", [{"role": "user", "content": 2**70}]) is None  # not serialisable: no key


async def test_local_pending_stops_counting_a_request_that_ended() -> None:
    clock = Clock()
    pending = LocalPending(window=10, clock=clock)
    release, both = asyncio.Event(), asyncio.Event()
    placed: list[int] = []

    async def request(wait: bool) -> None:
        pending.placed("M", 0)
        placed.append(1)
        if len(placed) == 5:
            both.set()
        if wait:
            await release.wait()

    for _ in range(3):  # one short request after another
        await asyncio.create_task(request(False))
    assert pending.busy("M", 0) == 0
    running = [asyncio.create_task(request(True)) for _ in range(2)]
    await both.wait()
    assert pending.busy("M", 0) == 2
    release.set()
    await asyncio.gather(*running)
    assert pending.busy("M", 0) == 0


@pytest.mark.parametrize("role", [["system"], {"r": 1}, 3])
def test_an_unhashable_or_odd_role_is_no_error(role: object) -> None:
    """A fuzzed ``role`` (a list is unhashable) keys on the first user turn, not a TypeError (a 500)."""
    messages = [{"role": role, "content": "x"}, {"role": "user", "content": "hi"}]
    assert conversation_key("m", messages) == conversation_key("m", [{"role": "user", "content": "hi"}])
