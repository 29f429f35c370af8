"""Every third-party module ``src/llmman`` imports comes from a distribution ``pyproject.toml`` declares in
``[project] dependencies`` or its ``server`` extra (the daemon's; tests/unit/test_install_extras.py checks
which side each belongs to), not one that merely happens to arrive with another package."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from tests.parsing import parse_source

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "llmman"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements() -> list[str]:
    """The base dependencies and the ``server`` extra's (llmman's own ``llmman[...]`` entries left out)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extra = [r for r in project["optional-dependencies"]["server"] if not r.startswith("llmman")]
    return [*project["dependencies"], *extra]


def _declared() -> set[str]:
    names = set()
    for requirement in _requirements():
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        assert match, requirement
        names.add(_normal(match[1]))
    return names


def _imported() -> dict[str, str]:
    """Top-level module -> the first file importing it, over every module of the package."""
    found: dict[str, str] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(parse_source(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".", 1)[0]
                if top != "llmman" and top not in sys.stdlib_module_names and top != "__future__":
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_imported_distribution_is_declared() -> None:
    declared = _declared()
    providers = importlib.metadata.packages_distributions()
    missing = []
    for module, where in sorted(_imported().items()):
        dists = {_normal(d) for d in providers.get(module, [])}
        assert dists, f"{module} (imported in {where}) is not installed"
        if not dists & declared:
            missing.append(f"{module} (imported in {where}; from {', '.join(sorted(dists))})")
    assert missing == [], "add to [project] dependencies or the server extra: " + "; ".join(missing)


def test_the_scan_sees_the_imports_it_must() -> None:
    imported = _imported()
    for module in ("starlette", "uvicorn", "httpx", "httpx2", "huggingface_hub", "tqdm", "truststore"):
        assert module in imported, module


def test_uvicorns_fast_parts_are_named_not_its_standard_extra() -> None:
    requirements = {_normal(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]): r for r in _requirements()}
    assert "[" not in requirements["uvicorn"]  # [standard] also brings websockets, watchfiles, dotenv
    assert "httptools" in requirements
    assert "sys_platform != 'win32'" in requirements["uvloop"]  # uvloop has no Windows build
