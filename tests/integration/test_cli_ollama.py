"""The command line an Ollama user expects, against real daemons with the real SmolLM2 model.

``llmman create -f Modelfile`` (from a stored model, and from a local GGUF uploaded with ``/api/blobs``),
``llmman run --verbose`` / ``--format json``, the chat REPL's ``/set``, ``/show``, ``/load`` and ``/save``,
and listings (``llmman list``, ``llmman ps``) that keep every reference whole, here and through a peer.
"""

from __future__ import annotations

import io
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import httpx
import pytest

from llmman.cli.client import DaemonClient
from llmman.cli.main import build_parser
from llmman.cli.repl import interactive_chat
from llmman.refs import parse_reference
from llmman.store import Store
from tests.integration.conftest import MODEL_NAME, MODEL_REF
from tests.integration.daemons import Daemon, local_tags, start_daemon, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.model]

SYSTEM = "You are a pirate.\nYou answer like one."


def llmman(d: Daemon, *argv: str, cwd: Path | None = None, stdin: str | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``llmman ARGV`` as a user runs it, against ``d``."""
    return subprocess.run([sys.executable, "-m", "llmman", *argv], env=d.env, cwd=cwd or d.home,
                          capture_output=True, text=True, timeout=timeout, check=False, input=stdin)


def show(d: Daemon, name: str) -> dict[str, object]:
    r = httpx.post(d.url + "/api/show", json={"model": name}, timeout=60)
    r.raise_for_status()
    data: dict[str, object] = r.json()
    return data


# -- create ---------------------------------------------------------------------------------------

def test_create_from_a_stored_model_with_every_instruction(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text(f'''# a pirate, made from the stored model
from {MODEL_NAME}
PARAMETER temperature 0
Parameter num_predict 12
PARAMETER stop "<|im_end|>"
PARAMETER stop ARRR
SYSTEM """{SYSTEM}"""
MESSAGE user Ahoy?
MESSAGE assistant "Ahoy, matey!"
LICENSE """Apache 2.0
of the base"""
''')
    done = llmman(daemon, "create", "pirate-cli", cwd=tmp_path)  # ./Modelfile by default
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0] == "gathering model components" and "success" in out, done.stdout
    shown = show(daemon, "pirate-cli")
    assert shown["system"] == SYSTEM
    params = [tuple(p.split(None, 1)) for p in str(shown["parameters"]).splitlines()]
    assert {("temperature", "0"), ("num_predict", "12")} <= set(params), params
    assert [value for name, value in params if name == "stop"] == ['"<|im_end|>"', '"ARRR"']
    assert shown["messages"] == [{"role": "user", "content": "Ahoy?"},
                                 {"role": "assistant", "content": "Ahoy, matey!"}]
    assert shown["license"] == "Apache 2.0\nof the base"
    answer = httpx.post(daemon.url + "/api/chat", timeout=300, json={
        "model": "pirate-cli", "stream": False, "messages": [{"role": "user", "content": "Hi"}]}).json()
    assert answer["eval_count"] <= 12  # the Modelfile's num_predict is applied


def test_a_modelfile_from_show_creates_the_model_again(daemon: Daemon, tmp_path: Path) -> None:
    r = httpx.post(daemon.url + "/api/create", timeout=120, json={
        "model": "roundtrip-base", "from": MODEL_NAME, "system": SYSTEM, "parameters": {"temperature": 0.3},
        "stream": False})
    assert r.status_code == 200, r.text
    generated = llmman(daemon, "show", "roundtrip-base", "--modelfile")
    assert generated.returncode == 0 and 'TEMPLATE """' in generated.stdout  # the GGUF's own template
    edited = generated.stdout.replace("\nSYSTEM ", "\nPARAMETER top_k 7\nSYSTEM ", 1)  # what a user does
    (tmp_path / "Modelfile").write_text(edited)
    done = llmman(daemon, "create", "roundtrip-copy", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    copy = show(daemon, "roundtrip-copy")
    assert copy["system"] == SYSTEM
    params = [tuple(p.split(None, 1)) for p in str(copy["parameters"]).splitlines()]
    assert {("temperature", "0.3"), ("top_k", "7")} <= set(params), params
    assert copy["template"] == show(daemon, MODEL_NAME)["template"]


def test_create_from_a_local_gguf_uploads_it_once(tmp_path: Path, model_file: Path) -> None:
    d = start_daemon(tmp_path / "empty")  # an empty store: the GGUF must travel through /api/blobs
    try:
        folder = tmp_path / "work"
        folder.mkdir()
        (folder / "weights.gguf").symlink_to(model_file)
        (folder / "Modelfile").write_text("FROM ./weights.gguf\nPARAMETER num_predict 4\n")
        first = llmman(d, "create", "smol-local:v1", "-f", str(folder / "Modelfile"))
        assert first.returncode == 0, first.stderr
        assert "success" in first.stdout.splitlines()
        assert "Already have" not in first.stdout  # it was uploaded
        [copied] = [line for line in first.stdout.splitlines() if line.startswith("copying file sha256:")]
        assert copied.endswith(" 100%")  # Ollama's words, on a pipe
        assert list(local_tags(d)) == ["docker.io/ai/smol-local:v1"]
        again = llmman(d, "create", "smol-local:v2", "-f", str(folder / "Modelfile"))
        assert again.returncode == 0, again.stderr
        assert "Already have sha256:" in again.stdout  # HEAD /api/blobs said so: no second upload
        ran = llmman(d, "run", "smol-local:v2", "Say hi")
        assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
    finally:
        d.stop(signal.SIGTERM)


@pytest.mark.parametrize(("line", "reason"), [
    ("TEMPLATE {{ .Prompt }}", "TEMPLATE is not supported by llmman: llama-server uses the chat template"),
    ("ADAPTER ./lora.gguf", "ADAPTER is not supported by llmman: LoRA adapters are not supported"),
    ("PARAMETER bogus_option 3", "unknown parameter 'bogus_option'"),
])
def test_create_refuses_with_the_reason(daemon: Daemon, tmp_path: Path, line: str, reason: str) -> None:
    (tmp_path / "Modelfile").write_text(f"FROM {MODEL_NAME}\n{line}\n")
    done = llmman(daemon, "create", "refused", cwd=tmp_path)
    assert done.returncode == 1
    assert reason in done.stderr and "Traceback" not in done.stderr
    assert "docker.io/ai/refused:latest" not in local_tags(daemon)


def test_create_says_where_a_modelfile_is_wrong(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text(f"FROM {MODEL_NAME}\nSYSTEM \"\"\"never closed\n")
    done = llmman(daemon, "create", "broken", cwd=tmp_path)
    assert done.returncode == 1 and "(line 2)" in done.stderr, done.stderr
    missing = llmman(daemon, "create", "broken", "-f", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "no Modelfile at" in missing.stderr


# -- run ------------------------------------------------------------------------------------------

def test_run_verbose_prints_ollama_timings(daemon: Daemon) -> None:
    done = llmman(daemon, "run", MODEL_NAME, "--verbose", "--num-predict", "6", "Say hello")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in done.stderr.splitlines()
             if ":" in line}
    for key in ("total duration", "prompt eval count", "prompt eval duration", "prompt eval rate",
                "eval count", "eval duration", "eval rate"):
        assert key in lines, done.stderr
    assert lines["eval count"] in {f"{n} token(s)" for n in range(1, 7)}
    assert lines["eval rate"].endswith(" tokens/s")


def test_run_format_json_answers_json(daemon: Daemon) -> None:
    done = llmman(daemon, "run", MODEL_NAME, "--format", "json", "--num-predict", "40",
                  "Describe a cat as a JSON object")
    assert done.returncode == 0, done.stderr
    assert done.stdout.lstrip().startswith("{")  # the grammar only lets JSON through


# -- the REPL -------------------------------------------------------------------------------------

def _chat(d: Daemon, lines: list[str], *argv: str) -> str:
    """Run the REPL on ``lines`` against ``d``; what it printed on stdout."""
    feed = iter(lines)

    def read(prompt: str) -> str:
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    out = io.StringIO()
    with redirect_stdout(out):
        assert interactive_chat(DaemonClient(d.url), build_parser().parse_args(["run", MODEL_NAME, *argv]),
                                read=read) == 0
    return out.getvalue()


def test_repl_set_show_and_save(daemon: Daemon, capfd: pytest.CaptureFixture[str]) -> None:
    out = _chat(daemon, [
        "/set parameter num_predict 3", "/set parameter temperature 0", '/set system """Be', 'brief."""',
        "/set verbose", "Hello there", "/show info", "/show system", "/save repl-saved", "/bye"])
    assert "Set parameter 'num_predict' to '3'" in out and "Set system message." in out
    assert "architecture        llama" in out  # /show info is llmman show
    assert "Be\nbrief." in out
    assert "Created new model 'repl-saved'" in out
    err = capfd.readouterr().err
    counts = [line for line in err.splitlines() if line.startswith("eval count:")]
    assert counts and int(counts[0].split()[2]) <= 3, err  # the /set parameter reached the request
    saved = show(daemon, "repl-saved")
    assert saved["system"] == "Be\nbrief."
    assert "num_predict" in str(saved["parameters"]) and "temperature" in str(saved["parameters"])
    messages = saved["messages"]
    assert isinstance(messages, list) and [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[0]["content"] == "Hello there"


def test_repl_load_switches_model(daemon: Daemon) -> None:
    copy = httpx.post(daemon.url + "/api/copy", json={"source": MODEL_NAME, "destination": "smol-other"},
                      timeout=60)
    assert copy.status_code == 200
    out = _chat(daemon, ["/load nowhere-to-be-found", "/load smol-other", "/set parameter num_predict 2",
                         "Hi"])
    assert "Couldn't find model 'nowhere-to-be-found'" in out
    assert "Loading model 'smol-other'" in out
    assert "Error" not in out

    def chats() -> list[dict[str, object]]:  # the daemon's request log (llmman.obs.requestlog)
        rows = httpx.get(daemon.url + "/llmman/requests", timeout=10).json()["requests"]
        return [row for row in rows if row["route"] == "/api/chat"]

    wait_until(lambda: any(row["model"] == "docker.io/ai/smol-other:latest" for row in chats()),
               "the chat turn after /load in the request log")
    [row] = [row for row in chats() if row["model"] == "docker.io/ai/smol-other:latest"]
    assert isinstance(row["completion_tokens"], int) and row["completion_tokens"] <= 2  # /set parameter


# -- listings -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, model_file: Path) -> Iterator[tuple[Daemon, Daemon]]:
    """``front`` names ``back`` as its peer; ``back`` stores the model under three whole references."""
    back_dir = tmp_path_factory.mktemp("back")
    store = Store(back_dir / "store")
    for name in ("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_1", "localhost:5000/team/smol",
                 MODEL_NAME):
        store.build(parse_reference(name), model_file)
    back = start_daemon(back_dir)
    try:
        front = start_daemon(tmp_path_factory.mktemp("front"), extra_env={"LLMMAN_PEERS": back.url})
        try:
            yield front, back
        finally:
            front.stop(signal.SIGTERM)
    finally:
        back.stop(signal.SIGTERM)


WHOLE = ("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_1", "localhost:5000/team/smol:latest", MODEL_REF)


def test_listings_keep_whole_references_here_and_through_a_peer(pair: tuple[Daemon, Daemon]) -> None:
    front, back = pair
    for d in (back, front):
        listed = llmman(d, "list")
        assert listed.returncode == 0, listed.stderr
        names = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
        assert sorted(names) == sorted(WHOLE), listed.stdout
    r = httpx.post(back.url + "/api/generate", json={"model": WHOLE[0], "keep_alive": "5m"}, timeout=300)
    assert r.status_code == 200, r.text
    for d, node_column in ((back, False), (front, True)):
        ps = llmman(d, "ps")
        assert ps.returncode == 0, ps.stderr
        header, *rows = ps.stdout.splitlines()
        assert ("NODE" in header.split()) is node_column
        assert [row.split()[0] for row in rows] == [WHOLE[0]], ps.stdout


PROBES = {
    "bash": 'source {script}; COMP_WORDS=(llmman run ""); COMP_CWORD=2; _shtab_llmman llmman "" run;'
            ' printf "%s\\n" "${{COMPREPLY[@]}}"',
    "fish": "source {script}; complete -C 'llmman run '",
}


@pytest.mark.parametrize("shell", sorted(PROBES))
def test_completion_offers_the_stored_names(pair: tuple[Daemon, Daemon], tmp_path: Path, shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    front, _ = pair
    script = llmman(front, "completion", shell)
    assert script.returncode == 0, script.stderr
    (tmp_path / "script").write_text(script.stdout)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llmman").write_text(f"#!/bin/sh\nexec {sys.executable} -m llmman \"$@\"\n")
    (bin_dir / "llmman").chmod(0o755)
    env = {**front.env, "PATH": f"{bin_dir}:{front.env.get('PATH', '')}"}
    done = subprocess.run([shell, "-c", PROBES[shell].format(script=tmp_path / "script")], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    offered = [line.split("\t")[0] for line in done.stdout.splitlines()]
    assert sorted(offered) == sorted(WHOLE), done.stdout  # the pool's names, the peer's too
