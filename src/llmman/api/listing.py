"""The store's listing for the list routes: ``/api/tags``, ``/v1/models``, ``/llmman/node`` and the details
of ``/api/ps``.

:func:`stored_listing` answers from the listing the store keeps in memory when it is current (two
``stat`` calls on the event loop, docs/store.md "Listing many models") and reads it in a thread of its own
otherwise (not the default executor's, which pulls can fill), so a store of thousands of models is never
read on the loop that relays inference. :func:`rendered` keeps what a route built from one listing (its
body), so an unchanged store is not rendered again.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar, cast

from llmman.api.services import Services
from llmman.store.listing import Listing

T = TypeVar("T")
#: The listing's own thread: the default executor also runs pulls and copies, which can hold all its
#: threads for minutes; refreshes take the store index's lock one at a time anyway.
_READER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmman-listing")
_Kept = dict[str, tuple[Hashable, object]]
_RENDERED: weakref.WeakKeyDictionary[Listing, _Kept] = weakref.WeakKeyDictionary()


async def stored_listing(services: Services, *, details: bool = False) -> Listing:
    """The store's current listing (``details``: with every model's GGUF header), read off the event
    loop when the kept one is not current."""
    store = services.store
    listing = store.listing_if_current(details=details)
    if listing is None:
        listing = await asyncio.get_running_loop().run_in_executor(
            _READER, partial(store.listing, details=details))
    return listing


def rendered(listing: Listing, key: str, variant: Hashable, build: Callable[[], T]) -> T:
    """What ``build`` makes of ``listing`` for route ``key``, built once per listing while ``variant`` (what
    else the answer depends on, such as the loaded models' contexts) stays the same: one value per
    listing and key is kept (the latest variant), and forgotten with the listing."""
    kept = _RENDERED.setdefault(listing, {})
    found = kept.get(key)
    if found is None or found[0] != variant:
        found = kept[key] = (variant, build())
    return cast(T, found[1])
