"""``llmman nodes``: the pool as the daemon sees it (``GET /llmman/pool``), as a table or as JSON.

Like ``ps``, it never starts a daemon: with nothing running there is no pool to show.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from llmman.cli.client import DaemonUnreachable, client_for

if TYPE_CHECKING:
    from llmman.config.settings import Settings

__all__ = ["cmd_nodes"]


def cmd_nodes(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman nodes [--json]``: NODE ADDRESS STATE MEMORY MODELS LAST SEEN, this node first."""
    from llmman.cli.tables import nodes_table

    with client_for(settings) as client:
        try:
            doc = client.pool()
        except DaemonUnreachable as exc:
            raise DaemonUnreachable(exc.url, "start it with 'llmman serve'") from None
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(nodes_table([n for n in doc.get("nodes") or [] if isinstance(n, dict)]))
    return 0
