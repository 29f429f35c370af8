"""Read deploy/kubernetes/ for the tests: its kustomizations, the objects of its files, the env files of
its generators, and (where ``kubectl`` is installed) each variant rendered by kustomize.

Used by tests/unit/test_kubernetes_manifests.py and tests/integration/test_kubernetes_probes.py.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "kubernetes"
BASE = DEPLOY / "base"
KEYS_EXAMPLE = BASE / "keys.env.example"
KEYS_FILE = "keys.env"  # the secretGenerator's source, made by the user from KEYS_EXAMPLE, never committed
VARIANTS = {"gpu": DEPLOY, "cpu": DEPLOY / "overlays" / "cpu", "pvc": DEPLOY / "overlays" / "pvc"}

Obj = dict[str, Any]


def load_docs(path: Path) -> list[Obj]:
    """The YAML documents of ``path`` (empty ones skipped)."""
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def kustomization_files() -> list[Path]:
    """Every kustomization.yaml under deploy/kubernetes/."""
    return sorted(DEPLOY.rglob("kustomization.yaml"))


def kustomization(directory: Path) -> Obj:
    """The kustomization (or component) of ``directory``."""
    (doc,) = load_docs(directory / "kustomization.yaml")
    assert isinstance(doc, dict)
    return doc


def read_env(path: Path) -> dict[str, str]:
    """An env file as kustomize's ``envs:`` reads it: ``KEY=VALUE`` lines; blanks and ``#`` lines skipped."""
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not KEY=VALUE: {line!r}"
        assert key not in out, f"{path}: {key} twice"
        out[key] = value
    return out


def source(path: Path) -> Path:
    """A generator's source file as the tests read it: keys.env (the user's own) is read from its example."""
    return KEYS_EXAMPLE if path == BASE / KEYS_FILE else path


@dataclass(frozen=True)
class Generator:
    """One entry of a kustomization's ``configMapGenerator`` or ``secretGenerator``."""

    kind: str  # ConfigMap or Secret
    name: str
    envs: tuple[Path, ...]
    files: dict[str, Path]  # key in the object -> source file

    def data(self) -> dict[str, str]:
        """The object's data as kustomize builds it from the source files."""
        data: dict[str, str] = {}
        for env in self.envs:
            data.update(read_env(source(env)))
        for key, path in self.files.items():
            data[key] = path.read_text(encoding="utf-8")
        return data


def generators(directory: Path) -> list[Generator]:
    """The generators of the kustomization in ``directory``, their sources as paths."""
    doc = kustomization(directory)
    out = []
    for field, kind in (("configMapGenerator", "ConfigMap"), ("secretGenerator", "Secret")):
        for entry in doc.get(field, []):
            files: dict[str, Path] = {}
            for item in entry.get("files", []):
                key, _, source = item.rpartition("=")
                files[key or Path(source).name] = directory / source
            envs = tuple(directory / env for env in entry.get("envs", []))
            out.append(Generator(kind, entry["name"], envs, files))
    return out


def generator(name: str) -> Generator:
    """The base's generator called ``name``."""
    (found,) = [g for g in generators(BASE) if g.name == name]
    return found


def base_objects() -> list[Obj]:
    """The objects of the base's ``resources`` files, as written (no kustomize)."""
    return [doc for entry in kustomization(BASE)["resources"] for doc in load_docs(BASE / entry)]


def find(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    """The one object of ``kind`` (and ``name``) among ``objects``."""
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} objects"
    return found[0]


def daemonset(objects: list[Obj] | None = None) -> Obj:
    """The DaemonSet (of the base, unless ``objects`` is given)."""
    return find(base_objects() if objects is None else objects, "DaemonSet")


def container(ds: Obj, name: str = "llmman") -> Obj:
    """The container ``name`` of a DaemonSet's pod template."""
    (found,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert isinstance(found, dict)
    return found


def pod_env() -> dict[str, str]:
    """What the llmman container's environment holds of llmman's variables: the settings ConfigMap's and
    the keys Secret's entries (``envFrom``; keys.env.example's), then the ``value`` entries of its ``env``."""
    env: dict[str, str] = {}
    for source in container(daemonset()).get("envFrom", []):
        ref = source.get("configMapRef") or source.get("secretRef")
        env.update(generator(ref["name"]).data())
    for entry in container(daemonset()).get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
    return env


def kubectl() -> str | None:
    """``kubectl`` on PATH (its built-in kustomize renders the variants), or None."""
    return shutil.which("kubectl")


def render(variant: str, tmp: Path) -> list[Obj]:
    """``kubectl kustomize`` of one variant, on a copy of deploy/kubernetes/ given keys.env (the example)."""
    binary = kubectl()
    assert binary is not None
    copy = tmp / "kubernetes"
    if not copy.exists():
        shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns(KEYS_FILE))
        shutil.copyfile(KEYS_EXAMPLE, copy / "base" / KEYS_FILE)
    where = copy / VARIANTS[variant].relative_to(DEPLOY)
    done = subprocess.run([binary, "kustomize", str(where)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


def walk(value: object) -> Iterator[tuple[str, object]]:
    """Every ``(key, value)`` pair in a nested object, at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key), item
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)
