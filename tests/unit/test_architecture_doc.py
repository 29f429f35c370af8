"""docs/architecture.md names only code that exists, so it cannot go stale without a failing test.

What is checked, in the inline ``backticks`` of the prose and tables and in the fenced blocks (the picture of
the data path, the layer list):

* a path ending in ``.py``, ``.md``, ``.toml`` or ``/`` names a file or folder of the repository, looked up
  from its root and from ``src/llmman`` (``api/inference.py``, ``gateway.py``, ``tests/unit/``);
* a dotted name names a module and then attributes of it: ``llmman.api.inference.run``, or any unambiguous
  tail of a module's dotted name (``placement.rank``, ``protocol.errors.error_frame``; plain ``errors`` is
  three modules and fails), or a name defined at the top level of exactly one module followed by its
  attributes (``Router.decide``, ``Intent.UNLOAD``; dataclass fields count), or a setting key
  (``server.host``), or an attribute of an importable module outside llmman (``os.environ``);
* a bare CamelCase name (``PeerAnswer``) and, in fenced blocks, every capitalised name (``Lease``; so a
  picture writes prose in lower case) and every snake_case name with an underscore (``open_forward``) is
  defined at the top level of some llmman module (a class, function, constant or type alias);
* a relative Markdown link names a file;
* the layer list under "Import rules" is the layers contract of ``pyproject.toml``, in its order.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import re
import tomllib
from functools import cache
from pathlib import Path
from types import ModuleType

from tests.parsing import parse_source

from llmman.config.table import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "llmman"
DOC = ROOT / "docs" / "architecture.md"

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
TICKS = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*(?:\.(?:py|md|toml)|/)")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
IDENT = re.compile(r"[A-Za-z_]\w*")
# In a picture: names not glued to a path, a dotted name or a header (``x-llmman-hop``).
FENCE_PATH = re.compile(r"(?<![\w./-])[\w-]+(?:/[\w.-]+)*\.(?:py|md|toml)(?![\w/-])")
FENCE_DOTTED = re.compile(r"(?<![\w./-])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?![\w/-])")
FENCE_IDENT = re.compile(r"(?<![\w./:-])[A-Za-z_]\w*(?![\w./-]|:\S)")
FILE_SUFFIXES = (".py", ".md", ".toml")


def _camel(name: str) -> bool:
    return name[0].isupper() and any(c.islower() for c in name) and any(c.isupper() for c in name[1:])


def _capitalised(name: str) -> bool:
    return name[0].isupper() and any(c.islower() for c in name)


def _snake(name: str) -> bool:
    return "_" in name.strip("_") and name.islower()


def references(text: str) -> tuple[set[str], set[str], set[str]]:
    """``(paths, dotted names, bare names)`` that ``text`` (Markdown) names as code."""
    paths: set[str] = set()
    dotted: set[str] = set()
    bare: set[str] = set()
    for block in FENCE.findall(text):
        paths.update(FENCE_PATH.findall(block))
        dotted.update(d for d in FENCE_DOTTED.findall(block) if not d.endswith(FILE_SUFFIXES))
        bare.update(n for n in FENCE_IDENT.findall(block)
                    if (_capitalised(n) or _snake(n)) and not hasattr(builtins, n))  # fresh=True
    for span in TICKS.findall(FENCE.sub("", text)):
        for word in span.split():
            word = word.rstrip(",;:").removesuffix("()")
            if PATH.fullmatch(word):
                paths.add(word)
            elif DOTTED.fullmatch(word):
                dotted.add(word)
            elif IDENT.fullmatch(word) and _camel(word):
                bare.add(word)
    return paths, dotted, bare


@cache
def modules() -> dict[str, Path]:
    """Every module of llmman by dotted name (a package by its own name)."""
    found = {}
    for path in SRC.rglob("*.py"):
        parts = ("llmman", *path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@cache
def definitions() -> dict[str, tuple[str, ...]]:
    """Each name defined at the top level of an llmman module (class, function, assignment; not an import)
    -> the modules that define it."""
    where: dict[str, list[str]] = {}
    for name, path in sorted(modules().items()):
        for node in parse_source(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                targets = [node.name]
            elif isinstance(node, ast.Assign):
                targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                targets = [node.target.id]
            else:
                continue
            for target in targets:
                where.setdefault(target, []).append(name)
    return {attr: tuple(names) for attr, names in where.items()}


def _attributes(obj: object, chain: list[str], what: str) -> str | None:
    """None when ``obj`` has the attributes ``chain`` in turn, else what is missing."""
    for attr in chain:
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif isinstance(obj, type) and dataclasses.is_dataclass(obj) \
                and attr in {f.name for f in dataclasses.fields(obj)}:
            return None  # a field without a default: no class attribute, still a name of the class
        else:
            return f"{what} has no attribute {attr!r}"
        what = f"{what}.{attr}"
    return None


def check_dotted(name: str) -> str | None:
    """None when ``name`` resolves (see the module docstring), else why not."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        tail = ".".join(parts[:k])
        found = sorted(m for m in modules() if m == tail or m.endswith("." + tail))
        if len(found) > 1:
            return f"{tail!r} is ambiguous: {', '.join(found)}"
        if found:
            if k == len(parts):
                return None
            return _attributes(importlib.import_module(found[0]), parts[k:], found[0])
    if name in {spec.key for spec in SETTINGS}:
        return None
    owners = definitions().get(parts[0], ())
    if len(owners) > 1:
        return f"{parts[0]!r} is defined in several modules: {', '.join(owners)}"
    if owners:
        return _attributes(getattr(importlib.import_module(owners[0]), parts[0]), parts[1:],
                           f"{owners[0]}.{parts[0]}")
    try:
        external: ModuleType = importlib.import_module(parts[0])
    except ImportError:
        return f"{parts[0]!r} is no llmman module, class or function, setting, or importable module"
    return _attributes(external, parts[1:], parts[0])


def check_path(path: str) -> str | None:
    want = path.rstrip("/")
    for base in (ROOT, SRC):
        target = base / want
        if (target.is_dir() if path.endswith("/") else target.is_file()):
            return None
    return f"no {'folder' if path.endswith('/') else 'file'} {path} under the repository root or src/llmman"


def test_patterns_find_what_they_should() -> None:
    text = ("See `llmman.api.inference.run` and `Router.decide()`, `api/relay.py`, `sched/`, `os.environ`,\n"
            "`.venv/bin/python -m pytest tests/unit/test_durations.py`, `PeerAnswer`, `keep_alive`.\n"
            "```\napi/inference.py  run: Router.decide(model) → open_forward, x-llmman-hop: 1\n"
            "  gateway.py  Gateway.ensure; build_app: a Lease, smollm2:135m, NDJSON\n```\n")
    paths, dotted, bare = references(text)
    assert paths == {"api/relay.py", "sched/", "tests/unit/test_durations.py", "api/inference.py",
                     "gateway.py"}
    assert dotted == {"llmman.api.inference.run", "Router.decide", "os.environ", "Gateway.ensure"}
    assert bare == {"PeerAnswer", "open_forward", "build_app", "Lease"}


def test_resolution_accepts_real_names_and_refuses_stale_ones() -> None:
    for good in ("llmman.cluster.placement.rank", "placement.rank", "Router.decide", "Intent.UNLOAD",
                 "Forward.otherwise", "protocol.errors.error_frame", "llmman.__main__", "os.environ",
                 "server.load_timeout"):
        assert check_dotted(good) is None, good
    for bad in ("errors.error_frame", "placement.no_such_rule", "scheduler_admission.Admission",
                "Router.no_such_method", "NoSuchClass.method"):
        assert check_dotted(bad) is not None, bad
    assert check_path("api/inference.py") is None
    assert check_path("tests/unit/") is None
    assert check_path("api/aggregate.py") is not None


def test_every_reference_names_existing_code() -> None:
    text = DOC.read_text(encoding="utf-8")
    paths, dotted, bare = references(text)
    assert len(paths) > 30 and len(dotted) > 50, "the doc's references were not found: check the patterns"
    problems = [f"`{p}`: {why}" for p in sorted(paths) if (why := check_path(p))]
    problems += [f"`{d}`: {why}" for d in sorted(dotted) if (why := check_dotted(d))]
    names = definitions()
    problems += [f"`{n}`: defined at the top level of no llmman module" for n in sorted(bare)
                 if n not in names]
    assert not problems, "docs/architecture.md names code that does not exist:\n" + "\n".join(problems)


def test_links_name_files() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [link for link in LINK.findall(text) if "://" not in link
               and not (DOC.parent / link.split("#", 1)[0]).exists()]
    assert not missing, f"docs/architecture.md links to missing files: {missing}"


def test_layers_are_those_of_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    section = DOC.read_text(encoding="utf-8").split("## Import rules", 1)[1]
    block = FENCE.findall(section)[0]
    assert [line.strip() for line in block.splitlines() if line.strip()] == layers
