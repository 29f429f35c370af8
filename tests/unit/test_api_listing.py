"""The list routes' access to the store's listing (llmman.api.listing): read in a thread of its own, so
pulls that hold every thread of the default executor do not hold ``/llmman/node`` back."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from ggufgen import write_gguf

from llmman.api.listing import rendered, stored_listing
from llmman.api.services import Services
from llmman.refs import parse_reference
from llmman.store import Store


def services_of(store: Store) -> Services:
    """What stored_listing reads of Services: its store."""
    return cast(Services, SimpleNamespace(store=store))


async def test_the_listing_is_read_while_the_default_executor_is_full(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.build(parse_reference("tiny:1"), write_gguf(tmp_path / "tiny.gguf"))
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    busy = [loop.run_in_executor(None, gate.wait) for _ in range(64)]  # more than its 32 threads at most
    try:
        listing = await asyncio.wait_for(stored_listing(services_of(store), details=True), timeout=30)
    finally:
        gate.set()
        await asyncio.gather(*busy)
    assert [m.reference for m in listing.models] == ["docker.io/ai/tiny:1"]
    model = listing.models[0]
    info = listing.info(model.digest)
    assert info is not None and info.architecture == "llama"


async def test_a_rendering_is_kept_per_listing_and_variant(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.build(parse_reference("tiny:1"), write_gguf(tmp_path / "tiny.gguf"))
    listing = await stored_listing(services_of(store))
    built: list[str] = []

    def build(text: str) -> str:
        built.append(text)
        return text

    assert rendered(listing, "route", 1, lambda: build("a")) == "a"
    assert rendered(listing, "route", 1, lambda: build("b")) == "a"
    assert rendered(listing, "route", 2, lambda: build("c")) == "c"
    assert rendered(listing, "other", 2, lambda: build("d")) == "d"
    store.build(parse_reference("tiny:2"), write_gguf(tmp_path / "tiny2.gguf", name="two"))
    fresh = await stored_listing(services_of(store))
    assert fresh is not listing and rendered(fresh, "route", 2, lambda: build("e")) == "e"
    assert built == ["a", "c", "d", "e"]
