"""Verbs that move models between registries and the store: ``pull``, ``push``, ``login``, ``logout``.

``pull``/``push`` go through the daemon (``/api/pull``, ``/api/push``) when one answers and no explicit
``--store`` was given, else they work on the store directly; either way the progress is the same
Ollama-shaped line stream, drawn by :class:`ProgressView`: a Rich bar per layer (bytes, rate, ETA),
``Already have <layer> (<size>)`` for layers that were present, other statuses printed once.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import threading
from typing import TYPE_CHECKING, Any

from llmman.cli.commands_store import _daemon
from llmman.errors import BadRequest, LlmmanError
from llmman.refs import HF_REGISTRY, parse_reference

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from llmman.config.settings import Settings

__all__ = ["ProgressView", "cmd_login", "cmd_logout", "cmd_pull", "cmd_push"]


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


class ProgressView:
    """Renders progress lines on stderr (bars) and stdout (statuses). Thread-safe."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._progress: Progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                            TransferSpeedColumn(), TimeRemainingColumn(),
                                            console=Console(stderr=True))
        self._tasks: dict[str, TaskID] = {}
        self._done: set[str] = set()
        self._last_status = ""
        self._lock = threading.Lock()
        self.success = False

    def __enter__(self) -> ProgressView:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def _say(self, text: str) -> None:
        """A status on stdout (through the live display when both go to a terminal)."""
        if sys.stdout.isatty():
            self._progress.console.print(text)
        else:
            print(text, flush=True)

    def __call__(self, line: dict[str, Any]) -> None:
        with self._lock:
            self._line(line)

    def _line(self, line: dict[str, Any]) -> None:
        if line.get("error"):
            raise LlmmanError(str(line["error"]))
        status = str(line.get("status") or "")
        digest, total = line.get("digest"), line.get("total")
        if isinstance(digest, str) and isinstance(total, int):
            done = int(line.get("completed") or 0)
            if digest in self._done:
                return
            if digest not in self._tasks:
                if total and done >= total:
                    self._done.add(digest)
                    self._say(f"Already have {status.split(' ')[-1]} ({_human(total)})")
                    return
                self._tasks[digest] = self._progress.add_task(status, total=total)
            self._progress.update(self._tasks[digest], completed=done)
            return
        if status and status != self._last_status:
            self._last_status = status
            self._say(status)
        if status == "success":
            self.success = True


def _transfer(args: argparse.Namespace, settings: Settings, verb: str) -> int:
    ref = parse_reference(args.ref, settings.aliases)
    client = _daemon(args, settings)
    with ProgressView() as view:
        if client is not None:
            with client:
                body = {"model": str(ref), "insecure": args.insecure}
                for line in client.ndjson_stream(f"/api/{verb}", body):
                    view(line)
        else:
            from llmman.registry.client import RegistryOptions
            from llmman.registry.credentials import CredentialStore
            from llmman.registry.puller import Puller
            from llmman.store import Store

            puller = Puller(Store(settings.models), CredentialStore.of(settings), offline=settings.offline,
                            options=RegistryOptions.of(settings))
            if verb == "pull":
                puller.pull(ref, view, insecure=args.insecure)
            else:
                puller.push(ref, view, insecure=args.insecure)
    if not view.success:
        raise LlmmanError(f"{ref}: stream ended without a success status")
    return 0


def cmd_pull(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman pull REF [--insecure]``."""
    return _transfer(args, settings, "pull")


def cmd_push(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman push REF [--insecure]``."""
    return _transfer(args, settings, "push")


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    if args.password is not None:
        return str(args.password)
    if not sys.stdin.isatty():
        raise BadRequest("cannot perform an interactive login from a non-TTY device")
    return getpass.getpass("Password: ")


def _server(text: str | None) -> str:
    """The registry a ``login``/``logout`` SERVER names, written as Docker accepts it too: ``host[:port]``,
    or a URL such as ``https://index.docker.io/v1/`` (scheme and path dropped); default docker.io."""
    if not text:
        return "docker.io"
    host = text.split("://", 1)[-1].split("/", 1)[0]
    return parse_reference(f"{host}/x/y").registry


def cmd_login(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman login [SERVER] [-u USER] [-p PASS | --password-stdin] [--insecure]``: check the
    credentials against the registry, then store them (Hugging Face: the token file)."""
    from llmman.registry.client import RegistryClient, RegistryOptions
    from llmman.registry.credentials import Credential, CredentialStore

    server = _server(args.server)
    if server == HF_REGISTRY:
        token = _password(args)
        path = settings.environment.hf_token_path  # where huggingface_hub reads it
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text(token)
        path.chmod(0o600)
        print(f"Login succeeded for {server}")
        return 0
    user = args.username
    if not user:
        if not sys.stdin.isatty():
            raise BadRequest("cannot perform an interactive login from a non-TTY device")
        user = input("Username: ")
    cred = Credential(user, _password(args))
    client = RegistryClient(server, None, insecure=args.insecure, credential=cred,
                            options=RegistryOptions.of(settings))
    try:
        client.check_login()
    finally:
        client.close()
    CredentialStore.of(settings).save(server, cred)
    print(f"Login succeeded for {server}")
    return 0


def cmd_logout(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman logout [SERVER]``."""
    from llmman.registry.credentials import CredentialStore

    server = _server(args.server)
    if server == HF_REGISTRY:
        settings.environment.hf_token_path.unlink(missing_ok=True)
    elif not CredentialStore.of(settings).remove(server):
        raise LlmmanError(f"not logged in to {server}")
    print(f"Logged out of {server}")
    return 0
