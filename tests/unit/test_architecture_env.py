"""``llmman.config`` is the only reader of the environment, and nothing writes it.

Every module under ``src/llmman`` is parsed with :mod:`ast`. Outside ``llmman/config/`` a module may not
touch ``os.environ``/``os.environb``/``os.getenv`` at all, except to copy the whole environment for a
child process (``dict(os.environ)``, ``os.environ.copy()``): settings and other tools' variables arrive
through :class:`llmman.config.Settings`. No module, ``config`` included, may write the environment
(``os.environ[k] = v``, ``del``, ``update``/``setdefault``/``pop``/``clear``, ``os.putenv``/``unsetenv``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tests.parsing import parse_source

SRC = Path(__file__).resolve().parents[2] / "src" / "llmman"
CONFIG = SRC / "config"
_MAPPINGS = frozenset({"environ", "environb"})
_READERS = frozenset({"getenv", "getenvb"})
_WRITERS = frozenset({"putenv", "unsetenv"})
_MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"})


def _os_names(tree: ast.Module) -> set[str]:
    """The names the module ``os`` is bound to (``import os``, ``import os as o``)."""
    return {alias.asname or "os" for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names if alias.name == "os"}


def _is_copy_for_a_child(node: ast.Attribute, parents: dict[ast.AST, ast.AST]) -> bool:
    """``dict(os.environ)`` or ``os.environ.copy()``: the whole environment, copied, not one setting."""
    parent = parents.get(node)
    if (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "dict"
            and parent.args == [node] and not parent.keywords):
        return True
    call = parents.get(parent) if parent is not None else None
    return (isinstance(parent, ast.Attribute) and parent.attr == "copy" and isinstance(call, ast.Call)
            and call.func is parent and not call.args and not call.keywords)


def _is_write(node: ast.Attribute, parents: dict[ast.AST, ast.AST]) -> bool:
    parent = parents.get(node)
    if isinstance(node.ctx, ast.Store | ast.Del):  # os.environ = {...}
        return True
    if isinstance(parent, ast.Subscript) and parent.value is node:
        return isinstance(parent.ctx, ast.Store | ast.Del)  # os.environ[k] = v, del os.environ[k]
    call = parents.get(parent) if parent is not None else None
    return (isinstance(parent, ast.Attribute) and parent.attr in _MUTATORS and isinstance(call, ast.Call)
            and call.func is parent)


def scan(source: str, *, may_read: bool) -> list[str]:
    """Every forbidden use of the environment in ``source``, as ``"line N: reads|writes ..."``.

    Args:
        source: a module's text.
        may_read: True for ``llmman.config`` (reads allowed, writes still forbidden).
    """
    tree = parse_source(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    names = _os_names(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            for alias in node.names:
                if alias.name in _WRITERS:
                    found.append(f"line {node.lineno}: writes the environment (from os import {alias.name})")
                elif alias.name in _MAPPINGS | _READERS and not may_read:
                    found.append(f"line {node.lineno}: reads the environment (from os import {alias.name})")
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in names):
            continue
        text = ast.unparse(parents.get(node, node))
        if node.attr in _WRITERS:
            found.append(f"line {node.lineno}: writes the environment: {text}")
        elif node.attr in _READERS and not may_read:
            found.append(f"line {node.lineno}: reads the environment: {text}")
        elif node.attr in _MAPPINGS:
            if _is_write(node, parents):
                found.append(f"line {node.lineno}: writes the environment: {text}")
            elif not may_read and not _is_copy_for_a_child(node, parents):
                found.append(f"line {node.lineno}: reads the environment: {text}")
    return sorted(found, key=lambda line: int(line.split()[1].rstrip(":")))


def _modules() -> list[Path]:
    modules = sorted(SRC.rglob("*.py"))
    assert len(modules) > 50 and CONFIG / "settings.py" in modules  # the scan covers the real tree
    return modules


def test_only_config_reads_the_environment() -> None:
    offences = [f"{path.relative_to(SRC.parent)} {finding}" for path in _modules()
                if not path.is_relative_to(CONFIG)
                for finding in scan(path.read_text(encoding="utf-8"), may_read=False)]
    assert offences == [], "read settings through llmman.config (Settings), not os.environ:\n" + "\n".join(
        offences)


def test_nothing_writes_the_environment() -> None:
    offences = [f"{path.relative_to(SRC.parent)} {finding}" for path in _modules()
                for finding in scan(path.read_text(encoding="utf-8"), may_read=True)]
    assert offences == [], "pass values explicitly instead of writing os.environ:\n" + "\n".join(offences)


def test_config_does_read_the_environment() -> None:
    """The rule has a reader to protect: ``llmman.config`` reads ``os.environ`` (and the scan sees it)."""
    text = (CONFIG / "settings.py").read_text(encoding="utf-8")
    assert scan(text, may_read=False) and not scan(text, may_read=True)


@pytest.mark.parametrize("source", [
    'import os\nhosts = os.environ.get("LLMMAN_INSECURE_REGISTRIES", "").split(",")\n',
    'import os\nif os.environ.get("HF_TOKEN_PATH"):\n    path = os.environ["HF_TOKEN_PATH"]\n',
    'import os\nendpoint = os.getenv("HF_ENDPOINT")\n',
    'import os\nhas = "DOCKER_CONFIG" in os.environ\n',
    'import os as system\nbase = system.environ.get("DOCKER_CONFIG")\n',
    'from os import environ\n',
    'from os import getenv\n',
    'import os\nenv = dict(os.environ, LLMMAN_MODELS="/s")\n',  # a copy plus a setting: not a plain copy
])
def test_the_scan_catches_reads(source: str) -> None:
    found = scan(source, may_read=False)
    assert found and all("reads the environment" in line for line in found), found
    assert scan(source, may_read=True) == []


@pytest.mark.parametrize("source", [
    'import os\nos.environ["LLMMAN_TLS_CA"] = "/ca.pem"\n',
    'import os\nos.environ.setdefault("LLMMAN_TLS_CA", "/ca.pem")\n',
    'import os\nos.environ.update({"A": "b"})\n',
    'import os\nos.environ.pop("A", None)\n',
    'import os\ndel os.environ["A"]\n',
    'import os\nos.environ["A"] += "b"\n',
    'import os\nos.putenv("A", "b")\n',
    'import os\nos.unsetenv("A")\n',
    'from os import putenv\n',
])
def test_the_scan_catches_writes(source: str) -> None:
    assert any("writes the environment" in line for line in scan(source, may_read=True)), source
    assert any("writes the environment" in line for line in scan(source, may_read=False)), source


@pytest.mark.parametrize("source", [
    "import os\nenv = dict(os.environ)\n",
    "import os\nenv = os.environ.copy()\n",
    "import os\npath = os.path.join('a', 'b')\n",
    "def child(environ: dict[str, str]) -> dict[str, str]:\n    return dict(environ)\n",
])
def test_whole_environment_copies_for_a_child_are_allowed(source: str) -> None:
    assert scan(source, may_read=False) == []
