"""Start real ``llmman serve`` daemons as subprocesses for integration tests.

Each daemon gets its own HOME, store, config and loopback port, so tests never touch the user's
files and can run several daemons side by side.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class Daemon:
    """A running ``llmman serve`` subprocess."""

    process: subprocess.Popen[bytes]
    url: str
    home: Path
    store: Path
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    def client(self, timeout: float | None = 120.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)

    def children(self) -> list[psutil.Process]:
        """llama-server processes started by this daemon (its direct children)."""
        try:
            parent = psutil.Process(self.process.pid)
            return [c for c in parent.children(recursive=True) if _is_llama(c)]
        except psutil.NoSuchProcess:
            return []

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)


def _is_llama(proc: psutil.Process) -> bool:
    try:
        return "llama-server" in " ".join(proc.cmdline()) or "fake_llama_server" in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def start_daemon(tmp: Path, *, extra_env: Mapping[str, str] | None = None, host: str = "127.0.0.1",
                 args: list[str] | None = None, ready_timeout: float = 60.0,
                 port: int | None = None) -> Daemon:
    """Start ``python -m llmman serve`` with an isolated HOME/store; return once ``/api/version`` answers.

    With ``LLMMAN_TLS_CERT`` in ``extra_env`` the daemon serves ``https://`` (its ``LLMMAN_TLS_CA``, when
    given, verifies the readiness check).

    Raises:
        RuntimeError: the daemon exited or did not answer in time (its log is in the message).
    """
    home = tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    store = tmp / "store"
    port = port or free_port(host)  # a caller may pick it first, so two daemons can name each other
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_"))}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        LLMMAN_HOST=f"{host}:{port}",
        LLMMAN_MODELS=str(store),
        LLMMAN_OFFLINE="1",  # tests never reach a registry off this machine
        PYTHONUNBUFFERED="1",
    )
    env.update(extra_env or {})
    scheme = "https" if env.get("LLMMAN_TLS_CERT") else "http"
    if scheme == "https":
        env["LLMMAN_HOST"] = f"https://{host}:{port}"
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=env["LLMMAN_TLS_CA"]) \
        if env.get("LLMMAN_TLS_CA") else True
    log = tmp / "daemon.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "llmman", "serve", *(args or [])],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp,
        )
    daemon = Daemon(process=process, url=f"{scheme}://{host}:{port}", home=home, store=store, log=log,
                    env=env)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llmman serve exited with {process.returncode}:\n{daemon.log_text()}")
        try:
            answer = httpx.get(daemon.url + "/api/version", timeout=1.0, verify=verify)
            if answer.status_code == 200:
                return daemon
        except httpx.TransportError:
            pass
        time.sleep(0.05)  # polling for readiness of a subprocess; the event is the port answering
    process.kill()
    raise RuntimeError(f"llmman serve did not answer within {ready_timeout}s:\n{daemon.log_text()}")


@contextlib.contextmanager
def model_daemon(tmp: Path, model_file: Path, name: str = "smollm2:135m",
                 extra_env: Mapping[str, str] | None = None) -> Iterator[Daemon]:
    """A daemon with ``model_file`` built into its store as ``name``; stopped (SIGTERM) on exit."""
    from llmman.refs import parse_reference
    from llmman.store import Store

    Store(tmp / "store").build(parse_reference(name), model_file)
    d = start_daemon(tmp, extra_env=extra_env)
    try:
        yield d
    finally:
        if d.process.poll() is None:
            d.stop(signal.SIGTERM)


@dataclass
class Nodes:
    """Two daemons, each the other's peer: ``back`` stores the models, ``front`` stores nothing, so its
    requests are forwarded to ``back`` (a hop)."""

    back: Daemon
    front: Daemon


@contextlib.contextmanager
def hop_pair(back_tmp: Path, front_tmp: Path, hosts: tuple[str, str]) -> Iterator[Nodes]:
    """:class:`Nodes` on ``hosts`` (front, back) over the stores already in ``back_tmp`` and ``front_tmp``;
    both stopped on exit."""
    ports = free_port(hosts[0]), free_port(hosts[1])
    back = start_daemon(back_tmp, host=hosts[1], port=ports[1],
                        extra_env={"LLMMAN_PEERS": f"{hosts[0]}:{ports[0]}"})
    try:
        front = start_daemon(front_tmp, host=hosts[0], port=ports[0],
                             extra_env={"LLMMAN_PEERS": f"{hosts[1]}:{ports[1]}"})
        try:
            yield Nodes(back, front)
        finally:
            front.stop()
    finally:
        back.stop()


HOP = {"x-llmman-hop": "1"}  # a hopped request is served by, and answers for, the node it reaches only


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def local_ps(d: Daemon) -> list[str]:
    """The models ``d`` itself has loaded (``/api/ps`` with ``x-llmman-hop``: no peer's entries)."""
    r = httpx.get(d.url + "/api/ps", headers=HOP, timeout=10)
    r.raise_for_status()
    return [str(m["name"]) for m in r.json()["models"]]


def local_tags(d: Daemon) -> dict[str, str]:
    """The models ``d`` itself stores, name -> manifest digest (``/api/tags`` with ``x-llmman-hop``)."""
    r = httpx.get(d.url + "/api/tags", headers=HOP, timeout=10)
    r.raise_for_status()
    return {str(m["name"]): str(m["digest"]) for m in r.json()["models"]}
