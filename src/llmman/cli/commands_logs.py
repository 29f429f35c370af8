"""``llmman logs [MODEL] [-f] [-n N] [--node NODE]``: a node's logs, from any node of the pool.

Without MODEL, the daemon's own log; with it, that model's llama-server log. It asks the local daemon
(``LLMMAN_HOST``) for ``GET /llmman/logs`` (llmman.api.logs_route), which reads its own files or, with
``--node``, fetches the named peer's over the API: no file path ever leaves the daemon. ``-n N`` prints
the last N lines (default 100); ``-f`` goes on printing new lines as they are written (across
rotations) until Ctrl-C.
"""

from __future__ import annotations

import argparse
import http.client
import sys
from typing import TYPE_CHECKING, BinaryIO
from urllib.parse import urlencode

from llmman.cli.client import DaemonClient, DaemonUnreachable, _error_from, client_key
from llmman.errors import LlmmanError

if TYPE_CHECKING:
    from llmman.config.settings import Settings

__all__ = ["LogsClient", "cmd_logs", "logs_query"]


def logs_query(model: str | None, *, lines: int, follow: bool, node: str | None) -> str:
    """The ``/llmman/logs`` path and query for the command's arguments."""
    query: dict[str, str] = {"tail": str(lines)}
    if model:
        query["model"] = model
    if follow:
        query["follow"] = "1"
    if node:
        query["node"] = node
    return "/llmman/logs?" + urlencode(query)


class LogsClient(DaemonClient):
    """The daemon client with the logs route."""

    def copy_logs(self, path: str, out: BinaryIO, *, follow: bool) -> None:
        """``GET path`` and copy the answer to ``out`` as it comes (no timeout once connected when
        following: the stream lasts until the caller stops).

        Raises:
            LlmmanError: the daemon's error (404 for a model without a log, an unknown node).
        """
        conn, response = self._send("GET", path, None, None if follow else self.timeout)
        try:
            if response.status >= 400:
                raise _error_from(response.status, response.read())
            while chunk := response.read1(64 * 1024):
                out.write(chunk)
                out.flush()
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, BrokenPipeError):
                raise
            raise LlmmanError(f"logs: {exc or type(exc).__name__}") from exc
        finally:
            conn.close()


def cmd_logs(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman logs``."""
    if args.lines < 0:
        raise LlmmanError("-n must be 0 or more lines")
    client = LogsClient(settings.host.client_url(), api_key=client_key(settings), ca_file=settings.ca_file)
    path = logs_query(args.model, lines=args.lines, follow=args.follow, node=args.node)
    try:
        client.copy_logs(path, sys.stdout.buffer, follow=args.follow)
    except DaemonUnreachable as exc:
        raise DaemonUnreachable(exc.url, "start it with 'llmman serve'") from None
    return 0
