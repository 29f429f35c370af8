"""``ensure_server``: make sure a daemon answers, starting ``llmman serve`` in the background if not.

Used by ``llmman run`` (``ps`` never starts a daemon). The child is ``<python> -m llmman serve``,
detached in its own session so it outlives the CLI and never gets the terminal's Ctrl-C, with stdin
from ``/dev/null`` and stdout+stderr appended to ``<data_dir>/serve.log``. A ``--store`` given to the
CLI reaches the child as ``LLMMAN_MODELS``. The CLI then polls ``/api/version`` for up to 60 s; if the
child exits first or the time runs out, the error names the log file.

Only a daemon on a loopback address is started: when ``LLMMAN_HOST`` names another machine the CLI
cannot start it there, and says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llmman.cli.client import DaemonClient, DaemonUnreachable, client_for
from llmman.errors import LlmmanError

if TYPE_CHECKING:
    from llmman.config.settings import Settings

__all__ = ["ensure_server", "serve_log_path", "spawn_daemon"]

START_TIMEOUT = 60.0
_POLL_INTERVAL = 0.25


def serve_log_path(settings: Settings) -> Path:
    """Where an auto-started daemon writes its output: ``<data_dir>/serve.log``."""
    return settings.data_dir / "serve.log"


def spawn_daemon(
    log_path: Path,
    *,
    store: str | None = None,
    preload: str | None = None,
    command: Sequence[str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``llmman serve [preload]`` detached, output appended to ``log_path`` (parent dirs created).

    Args:
        log_path: the log file.
        store: a store directory to pass on as ``LLMMAN_MODELS``, or None for the configured one.
        preload: a model for ``serve`` to load at start.
        command: the argv to run instead of ``<python> -m llmman serve`` (tests).

    Raises:
        LlmmanError: the log file cannot be opened or the process cannot be started.
    """
    argv = list(command) if command is not None else [sys.executable, "-m", "llmman", "serve"]
    if preload and command is None:
        argv.append(preload)
    env = dict(os.environ)
    if store:
        env["LLMMAN_MODELS"] = str(Path(store).expanduser().resolve())
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
    except OSError as exc:
        raise LlmmanError(f"could not start llmman serve: {exc}") from exc


def ensure_server(
    settings: Settings,
    *,
    store: str | None = None,
    timeout: float = START_TIMEOUT,
    command: Sequence[str] | None = None,
) -> DaemonClient:
    """Return a client of a daemon that answers, starting one when nothing answers on a loopback address.

    Raises:
        DaemonUnreachable: nothing answers and the address is not local (we cannot start it there).
        LlmmanError: the started daemon exited, or did not answer within ``timeout`` seconds; the message
            names the log file.
    """
    client = client_for(settings)
    if client.ping():
        return client
    if not settings.host.is_loopback() and settings.host.host not in ("0.0.0.0", "::", ""):
        raise DaemonUnreachable(client.base_url, "is the daemon running on that machine?")
    if command is None:  # the child would only write this to serve.log: say it here, the same line
        from llmman.cli.serve_check import check_server_extra

        check_server_extra()
    log_path = serve_log_path(settings)
    child = spawn_daemon(log_path, store=store, command=command)
    # Reap the child when it ends so it never lingers as a zombie while we poll.
    exited = threading.Event()

    def reap() -> None:
        child.wait()
        exited.set()

    threading.Thread(target=reap, name="llmman-serve-reaper", daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        if client.ping():
            print(f"started llmman serve in the background (pid {child.pid}, log {log_path}); "
                  "stop it with: kill -TERM " + str(child.pid), file=sys.stderr)
            return client
        if exited.is_set():
            raise LlmmanError(
                f"llmman serve exited with status {child.returncode} before it answered; see {log_path}"
            )
        if time.monotonic() >= deadline:
            raise LlmmanError(f"llmman serve did not answer within {timeout:g} s; see {log_path}")
        exited.wait(_POLL_INTERVAL)
