"""Logs over the API and cold starts that talk, with real daemons whose llama-server is the fake (for its
load gate and its fixed answer): ``GET /llmman/logs`` returns a model's lines and the daemon's own, follows
a line written later, reaches another node of a two-node pool through ``node=``; ``llmman logs`` prints
them; ``llmman run`` of a cold model on a pseudo-terminal says where it is loading and then answers, and
piped prints the answer alone; a model no node stores is pulled with progress first.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llmman.cli.coldstart import CLEAR
from llmman.refs import parse_reference
from llmman.store import Store
from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import HOP, Daemon, free_port, start_daemon
from tests.integration.registry import available as registry_available
from tests.integration.registry import start_registry
from tests.unit.ggufgen import write_gguf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KEY = {"Authorization": "Bearer pool"}
REPLY = "the fake answers in nine words and then it stops"
LOG_NAME = "docker.io_ai_{}_latest.log"


def ref(name: str) -> str:
    return f"docker.io/ai/{name}:latest"


@dataclass
class Pool:
    front: Daemon  # "ay": stores nothing, names "bee"
    back: Daemon  # "bee": stores the models
    gate: Path  # the gated model's load finishes once this file exists


def fake_daemon(tmp: Path, env: dict[str, str], names: tuple[str, ...], *, host: str, port: int) -> Daemon:
    make_store(tmp, names)
    (tmp / "bin").mkdir(parents=True)
    per_model = {ref("gated"): {"FAKE_LOAD_GATE": str(tmp / "gate")},
                 ref("late"): {"FAKE_LOAD_GATE": str(tmp / "gate-late")}}
    return start_daemon(tmp, host=host, port=port, extra_env={
        "LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_MEMORY": "4GB",
        "LLMMAN_API_KEYS": "pool", "FAKE_REPLY": REPLY, "FAKE_PER_MODEL": json.dumps(per_model), **env})


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    hosts = "127.0.0.51", "127.0.0.52"
    ports = free_port(hosts[0]), free_port(hosts[1])
    back_dir = tmp_path_factory.mktemp("bee")
    back = fake_daemon(back_dir, {"LLMMAN_NODE_NAME": "bee", "LLMMAN_PEERS": f"{hosts[0]}:{ports[0]}"},
                       ("tiny", "gated", "late", "cold"), host=hosts[1], port=ports[1])
    try:
        front = fake_daemon(tmp_path_factory.mktemp("ay"), {
            "LLMMAN_NODE_NAME": "ay", "LLMMAN_PEERS": f"{hosts[1]}:{ports[1]}"}, (),
            host=hosts[0], port=ports[0])
        try:
            yield Pool(front, back, back_dir / "gate")
        finally:
            front.stop()
    finally:
        back.stop()


def logs(d: Daemon, **params: str) -> httpx.Response:
    return httpx.get(d.url + "/llmman/logs", params=params, headers=KEY, timeout=30)


def chat(d: Daemon, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    r = httpx.post(d.url + "/api/chat", json=body, headers=KEY, timeout=60)
    assert r.status_code == 200, r.text
    return str(r.json()["message"]["content"])


def unload(d: Daemon, model: str) -> None:
    r = httpx.post(d.url + "/api/generate", json={"model": model, "keep_alive": 0}, headers=KEY, timeout=60)
    assert r.status_code == 200, r.text


def file_lines(d: Daemon, name: str) -> list[str]:
    return (d.store.parent / "logs" / name).read_text().splitlines()


@pytest.fixture(scope="module")
def tiny_loaded(pool: Pool) -> Pool:
    assert chat(pool.back, "tiny") == REPLY
    return pool


def test_the_route_returns_a_models_log_and_the_daemons_own(tiny_loaded: Pool) -> None:
    back = tiny_loaded.back
    r = logs(back, model="tiny")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    lines = r.text.splitlines()
    assert any(line.startswith("--- llmman ") and "ready on http://" in line for line in lines), lines
    assert lines == file_lines(back, LOG_NAME.format("tiny"))[-len(lines):]
    last = logs(back, model="tiny", tail="2").text.splitlines()
    assert last == file_lines(back, LOG_NAME.format("tiny"))[-2:]
    assert logs(back, model="tiny", tail="0").text == ""
    own = logs(back).text.splitlines()
    assert own and own == file_lines(back, "llmman.log")[-len(own):]
    assert any("listening on" in line or "INFO" in line for line in own), own


def test_the_route_refuses_what_it_cannot_serve(tiny_loaded: Pool) -> None:
    back = tiny_loaded.back
    assert httpx.get(back.url + "/llmman/logs", timeout=10).status_code == 401  # behind the API key
    missing = logs(back, model="never-loaded")
    assert missing.status_code == 404 and "no log on this node" in missing.json()["error"], missing.text
    assert logs(back, model="tiny", tail="many").status_code == 400
    assert logs(back, model="../../etc/passwd").status_code == 404  # a name, never a path
    assert logs(tiny_loaded.front, node="nobody").status_code == 404


def _follow(d: Daemon, params: dict[str, str], until: str, lines: list[str], opened: threading.Event) -> None:
    with httpx.stream("GET", d.url + "/llmman/logs", params={**params, "follow": "1", "tail": "0"},
                      headers=KEY, timeout=httpx.Timeout(60, read=60)) as r:
        assert r.status_code == 200
        opened.set()
        for line in r.iter_lines():
            lines.append(line)
            if until in line:
                return


@pytest.mark.parametrize("via", ["bee", "ay"])
def test_follow_streams_a_line_written_later_also_from_another_node(pool: Pool, via: str) -> None:
    """``follow=1&tail=0`` sends nothing old: the "stopping" line of an unload made after it started is
    what comes; through the front node with ``node=bee`` the same, relayed."""
    assert chat(pool.back, "tiny") == REPLY
    d, params = (pool.back, {"model": "tiny"}) if via == "bee" else \
        (pool.front, {"model": "tiny", "node": "bee"})
    lines: list[str] = []
    opened = threading.Event()
    reader = threading.Thread(target=_follow, args=(d, params, "stopped, exit code", lines, opened))
    reader.start()
    assert opened.wait(30)  # the headers came: the log is open for following, from its end
    unload(pool.back, "tiny")
    reader.join(timeout=60)
    assert not reader.is_alive()
    assert any("stopping: SIGTERM" in line for line in lines), lines
    assert not any("ready on http://" in line for line in lines), lines  # tail=0: nothing from before


def test_the_front_node_returns_the_peers_log(tiny_loaded: Pool) -> None:
    back, front = tiny_loaded.back, tiny_loaded.front
    assert chat(back, "tiny") == REPLY
    for node in ("bee", back.url.removeprefix("http://")):
        r = logs(front, model="tiny", node=node, tail="5")
        assert r.status_code == 200, r.text
        assert r.text.splitlines() == logs(back, model="tiny", tail="5").text.splitlines()
    assert logs(front, node="ay").text.splitlines()[-1:] == file_lines(front, "llmman.log")[-1:]
    hopped = httpx.get(front.url + "/llmman/logs", params={"node": "bee"}, headers={**KEY, **HOP}, timeout=10)
    assert hopped.status_code == 404  # a hop is the node's own: never sent on


def cli(d: Daemon, *args: str, stdin: int | None = subprocess.DEVNULL, stdout: int = subprocess.PIPE,
        stderr: int = subprocess.PIPE) -> subprocess.Popen[str]:
    env = {**d.env, "LLMMAN_API_KEY": "pool"}
    return subprocess.Popen([sys.executable, "-m", "llmman", *args], env=env, text=True, cwd=d.home,
                            stdin=stdin, stdout=stdout, stderr=stderr)


def test_llmman_logs_prints_the_lines_of_any_node(tiny_loaded: Pool) -> None:
    back, front = tiny_loaded.back, tiny_loaded.front
    assert chat(back, "tiny") == REPLY
    expected = logs(back, model="tiny", tail="3").text
    for d, extra in ((back, ()), (front, ("--node", "bee"))):
        proc = cli(d, "logs", "tiny", "-n", "3", *extra)
        out, err = proc.communicate(timeout=60)
        assert (proc.returncode, out, err) == (0, expected, "")
    proc = cli(front, "logs", "never-loaded", "--node", "bee")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and out == "" and "no log on this node" in err, err


class Terminal:
    """``llmman ARGS`` on a pseudo-terminal (stdin too with ``interactive``); what it prints, collected."""

    def __init__(self, d: Daemon, *args: str, interactive: bool = False) -> None:
        self.master, slave = os.openpty()
        stdin = slave if interactive else subprocess.DEVNULL
        self.proc = cli(d, *args, stdin=stdin, stdout=slave, stderr=slave)
        os.close(slave)
        self.output = bytearray()
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.master], [], [], 60)
            if not ready:
                return
            try:
                data = os.read(self.master, 4096)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not data:
                return
            with self._seen:
                self.output.extend(data)
                self._seen.notify_all()

    def wait_for(self, text: str, after: int = 0) -> int:
        """Wait (60 s at most) until ``text`` is printed at or after ``after``; its position."""
        with self._seen:
            found = self._seen.wait_for(lambda: self.output.find(text.encode(), after) >= 0, timeout=60)
            assert found, bytes(self.output)
            return self.output.find(text.encode(), after)

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def close(self) -> str:
        """Wait for the command to end; everything it printed."""
        try:
            assert self.proc.wait(timeout=60) == 0, bytes(self.output)
            self._reader.join(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            os.close(self.master)
        return bytes(self.output).decode()


def test_llmman_run_on_a_terminal_says_where_a_cold_model_loads_then_answers(pool: Pool) -> None:
    term = Terminal(pool.front, "run", "gated", "hi")
    term.wait_for("loading gated on bee…")  # ay stores nothing: bee loads it, /api/ps on ay says so
    pool.gate.touch()  # the load finishes: the answer comes
    text = term.close()
    spinner = text.rindex("loading gated on bee")
    assert text.index(CLEAR, spinner) < text.index(REPLY), text  # the line is cleared before the answer
    assert text.rstrip().endswith(REPLY), text


def test_an_interactive_run_loads_the_model_saying_so_before_its_first_prompt(pool: Pool) -> None:
    term = Terminal(pool.front, "run", "late", interactive=True)
    spinner = term.wait_for("loading late on bee…")
    assert b">>> " not in term.output  # no prompt while it loads
    pool.gate.with_name("gate-late").touch()
    prompt = term.wait_for(">>> ", spinner)
    assert term.output.find(CLEAR.encode(), spinner) < prompt
    term.type("hi")
    answer = term.wait_for(REPLY, prompt)
    term.wait_for(">>> ", answer)
    term.type("/bye")
    term.close()


def test_llmman_run_piped_prints_the_answer_alone(pool: Pool) -> None:
    proc = cli(pool.front, "run", "cold", "hi")
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err) == (0, REPLY + "\n", "")


def test_log_file_size_rotates_a_models_log_and_the_route_reads_across(tmp_path: Path) -> None:
    """``log.file_size`` / ``log.file_count`` reach the children's logs: loads and unloads grow the log
    past 2 KiB, it is rotated with one old file kept, and the route's tail spans both files."""
    d = fake_daemon(tmp_path, {"LLMMAN_LOG_FILE_SIZE": "2KiB", "LLMMAN_LOG_FILE_COUNT": "1"}, ("tiny",),
                    host="127.0.0.1", port=free_port())
    try:
        logs_dir = d.store.parent / "logs"
        current, old = logs_dir / LOG_NAME.format("tiny"), logs_dir / (LOG_NAME.format("tiny") + ".1")
        for _ in range(50):
            assert chat(d, "tiny") == REPLY
            unload(d, "tiny")
            if old.exists() and current.exists() and current.stat().st_size:
                break
        assert old.exists(), sorted(p.name for p in logs_dir.iterdir())
        assert not (logs_dir / (LOG_NAME.format("tiny") + ".2")).exists()
        assert old.stat().st_size <= 2048 and current.stat().st_size <= 2048
        both = old.read_text().splitlines() + current.read_text().splitlines()
        n = len(current.read_text().splitlines()) + 2  # reaches back into the rotated file
        assert logs(d, model="tiny", tail=str(n)).text.splitlines() == both[-n:]
    finally:
        d.stop()


@pytest.mark.skipif(not registry_available(), reason="docker-registry missing")
def test_llmman_run_on_a_terminal_pulls_a_missing_model_with_progress_then_answers(tmp_path: Path) -> None:
    """A model no node stores: ``llmman run`` pulls it from a real registry (on loopback) with the pull's
    progress before the answer."""
    registry = start_registry(tmp_path / "registry")
    try:
        name = f"{registry.host}/ai/pulled:latest"
        source = tmp_path / "source"
        Store(source).build(parse_reference(name), write_gguf(tmp_path / "pulled.gguf", name="Tiny pulled"))
        d = fake_daemon(tmp_path / "node", {}, (), host="127.0.0.1", port=free_port())
        try:
            push = cli(d, "push", "--store", str(source), name)
            out, err = push.communicate(timeout=120)
            assert push.returncode == 0, out + err
            term = Terminal(d, "run", name, "hi")
            text = term.close()
        finally:
            d.stop()
    finally:
        registry.stop()
    assert text.index("pulling manifest") < text.index("success") < text.index(REPLY), text
    assert text.rstrip().endswith(REPLY), text
