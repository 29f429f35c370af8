"""``llmman drain [NODE] [--wait]`` and ``llmman undrain [NODE]``: take a node out of the pool and back.

Both go to the local daemon (``LLMMAN_HOST``), which acts on itself or sends the request on to the peer
named NODE (its ``node.name`` or ``host:port``; llmman.api.drain). ``--wait`` polls
``GET /llmman/drain?node=NODE`` until the node has no request left and nothing loaded, printing each
change, so a rolling upgrade can go on once it returns: drain, wait, upgrade, undrain.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from llmman.cli.client import DaemonClient, DaemonUnreachable, client_key

if TYPE_CHECKING:
    from llmman.config.settings import Settings

__all__ = ["cmd_drain", "cmd_undrain", "describe", "drained"]

POLL_S = 0.5  # seconds between two looks at a draining node (--wait)


class DrainClient(DaemonClient):
    """The daemon client with the drain routes."""

    def drain(self, node: str, *, undo: bool = False) -> dict[str, Any]:
        """``POST /llmman/drain`` (``/llmman/undrain`` with ``undo``) for ``node`` ('' = the daemon)."""
        path = "/llmman/undrain" if undo else "/llmman/drain"
        return dict(self._request("POST", path, {"node": node} if node else None) or {})

    def drain_state(self, node: str) -> dict[str, Any]:
        """``GET /llmman/drain?node=NODE``: the node's state without changing it."""
        query = f"?node={quote(node, safe='')}" if node else ""
        return dict(self._request("GET", "/llmman/drain" + query) or {})


def _client(settings: Settings) -> DrainClient:
    return DrainClient(settings.host.client_url(), api_key=client_key(settings), ca_file=settings.ca_file)


def describe(doc: dict[str, Any]) -> str:
    """One line for a drain answer: ``spark: draining, 2 requests, 1 model loaded``."""
    requests, loaded = int(doc.get("in_flight") or 0), int(doc.get("loaded") or 0)
    return (f"{doc.get('node', '?')}: {doc.get('state', '?')}, {requests} request{'s' * (requests != 1)}, "
            f"{loaded} model{'s' * (loaded != 1)} loaded")


def drained(doc: dict[str, Any]) -> bool:
    """True when the node has nothing left: no request on it and no model loaded."""
    return not doc.get("in_flight") and not doc.get("loaded")


def cmd_drain(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman drain [NODE] [--wait]``."""
    node, client = args.node or "", _client(settings)
    doc = _call(lambda: client.drain(node))
    shown = describe(doc)
    print(shown, flush=True)
    if not args.wait:
        return 0
    while not drained(doc):
        time.sleep(POLL_S)  # a human-facing poll of another process's state
        doc = _call(lambda: client.drain_state(node))
        if describe(doc) != shown:
            shown = describe(doc)
            print(shown, flush=True)
        if doc.get("state") != "draining":
            name = doc.get("node", node)
            print(f"Error: {name} is serving again (undrained meanwhile)", file=sys.stderr)
            return 1
    print(f"{doc.get('node', node)}: drained", flush=True)
    return 0


def cmd_undrain(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman undrain [NODE]``."""
    client = _client(settings)
    print(describe(_call(lambda: client.drain(args.node or "", undo=True))), flush=True)
    return 0


def _call(step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one client call; an absent daemon says how to start one."""
    try:
        return step()
    except DaemonUnreachable as exc:
        raise DaemonUnreachable(exc.url, "start it with 'llmman serve'") from None
