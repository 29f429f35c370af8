"""The CLI end to end in-process: argparse routing, and verbs against a fake of the daemon.

``FakeDaemon`` is a stdlib ``http.server`` on 127.0.0.1:0 serving canned JSON (and NDJSON for
``/api/chat``) and recording what it was sent. ``FakeStore`` stands in for ``llmman.store.Store`` for
the verbs that fall back to the store when no daemon answers.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llmman.cli import commands_store
from llmman.cli.autostart import ensure_server
from llmman.cli.client import DaemonClient, DaemonUnreachable
from llmman.cli.main import _HANDLERS, build_parser, main, resolve_handler
from llmman.cli.repl import interactive_chat
from llmman.config.settings import load_settings
from llmman.errors import LlmmanError, ModelNotFound

Reply = tuple[int, Any]  # (status, JSON body | list of NDJSON objects | None)


class FakeDaemon:
    """A fake of the llmman daemon: canned answers per (method, path), every request recorded."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Reply] = {("GET", "/api/version"): (200, {"version": "0.1.0"})}
        self.requests: list[tuple[str, str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                fake.requests.append((self.command, self.path, json.loads(raw) if raw else None))
                status, body = fake.routes.get((self.command, self.path), (404, {"error": "no route"}))
                self.send_response(status)
                if isinstance(body, list):  # NDJSON stream, ended by closing the connection
                    self.send_header("content-type", "application/x-ndjson")
                    self.end_headers()
                    for obj in body:
                        self.wfile.write(json.dumps(obj).encode() + b"\n")
                        self.wfile.flush()
                    return
                data = b"" if body is None else json.dumps(body).encode()
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01},
                                       daemon=True)

    def bodies(self, method: str, path: str) -> list[Any]:
        return [body for m, p, body in self.requests if (m, p) == (method, path)]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A clean environment: no user config, no LLMMAN_/OLLAMA_ variables, a store under tmp_path."""
    for key in list(os.environ):
        if key.startswith(("LLMMAN_", "OLLAMA_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("LLMMAN_MODELS", str(tmp_path / "data" / "store"))
    return tmp_path


@pytest.fixture
def daemon(env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDaemon]:
    fake = FakeDaemon()
    fake.thread.start()
    monkeypatch.setenv("LLMMAN_HOST", f"127.0.0.1:{fake.port}")
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def nothing_listening(env: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    port = free_port()
    monkeypatch.setenv("LLMMAN_HOST", f"127.0.0.1:{port}")
    return port


# -- routing --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("argv", "verb", "fields"),
    [
        (["serve"], "serve", {"model": None, "host": None}),
        (["serve", "smollm2", "--store", "/s", "--host", "0.0.0.0:1"], "serve",
         {"model": "smollm2", "store": "/s", "host": "0.0.0.0:1"}),
        (["run", "m"], "run", {"model": "m", "prompt": [], "think": None, "keepalive": None}),
        (["run", "m", "hello", "world", "--think", "high", "--keepalive", "5m", "--num-predict", "7"], "run",
         {"prompt": ["hello", "world"], "think": "high", "keepalive": "5m", "num_predict": 7}),
        (["run", "--think", "false", "m", "--", "-x"], "run", {"think": False, "prompt": ["-x"]}),
        (["ps"], "ps", {}),
        (["stop", "m"], "stop", {"model": "m"}),
        (["list"], "list", {"filter": None}),
        (["ls", "smollm2", "--store", "/s"], "list", {"filter": "smollm2", "store": "/s"}),
        (["--store", "/g", "ls"], "list", {"store": "/g"}),
        (["rm", "a", "b"], "rm", {"refs": ["a", "b"]}),
        (["tag", "a", "b"], "tag", {"source": "a", "destination": "b"}),
        (["cp", "a", "b"], "tag", {"source": "a", "destination": "b"}),
        (["show", "m", "--template"], "show", {"model": "m", "template": True, "verbose": False}),
        (["show", "m", "-v"], "show", {"verbose": True, "modelfile": False}),
        (["inspect", "r"], "inspect", {"ref": "r"}),
        (["build", "-t", "r", "-l", "a=b", "--label", "c=d=e", "dir"], "build",
         {"tag": "r", "label": [("a", "b"), ("c", "d=e")], "path": "dir"}),
        (["build", "--tag", "r"], "build", {"path": "."}),
        (["config", "list", "--show-origin"], "config", {"action": "list", "show_origin": True}),
        (["config", "get", "k"], "config", {"action": "get", "key": "k"}),
        (["config", "set", "k", "v"], "config", {"action": "set", "key": "k", "value": "v"}),
        (["config", "unset", "k"], "config", {"action": "unset", "key": "k"}),
    ],
)
def test_routing(argv: list[str], verb: str, fields: dict[str, object]) -> None:
    args = build_parser().parse_args(argv)
    assert args.verb == verb
    for name, value in fields.items():
        assert getattr(args, name) == value
    assert callable(resolve_handler(verb))


def test_every_verb_has_a_handler() -> None:
    for verb in _HANDLERS:
        assert callable(resolve_handler(verb))


@pytest.mark.parametrize(
    "argv",
    [[], ["bogus"], ["run"], ["run", "m", "--think", "maybe"], ["build", "."],
     ["build", "-t", "r", "-l", "x"], ["show", "m", "--template", "--license"], ["config"], ["rm"]],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == "llmman 0.1.0\n"


# -- ps, stop -------------------------------------------------------------------------------------

def test_ps_prints_the_table(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    now = datetime.now(UTC)
    daemon.routes[("GET", "/api/ps")] = (200, {"models": [{
        "name": "docker.io/ai/smollm2:135m", "model": "docker.io/ai/smollm2:135m", "size": 98_300_000,
        "size_vram": 0, "digest": "0123456789ab" + "0" * 52, "details": {}, "context_length": 4096,
        "processor": "llama-server", "started_at": (now - timedelta(seconds=330)).isoformat(),
        "expires_at": (now + timedelta(days=300 * 365)).isoformat(),
    }]})
    assert main(["ps"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "STARTED", "UNTIL"]
    assert lines[1] == ("docker.io/ai/smollm2:135m    0123456789ab    98.3 MB    llama-server    4096       "
                        "5 minutes ago    Forever")
    assert len(lines) == 2


def test_ps_without_daemon_is_a_clear_error(nothing_listening: int,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ps"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"Error: could not connect to llmman serve at http://127.0.0.1:{nothing_listening}"
                            " — start it with 'llmman serve'\n")


def test_stop_unloads(daemon: FakeDaemon) -> None:
    daemon.routes[("POST", "/api/generate")] = (200, {"done": True, "done_reason": "unload"})
    assert main(["stop", "smollm2"]) == 0
    assert daemon.bodies("POST", "/api/generate") == [{"model": "smollm2", "keep_alive": 0}]


def test_stop_error_from_daemon(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.routes[("POST", "/api/generate")] = (404, {"error": "model 'nope' not found"})
    assert main(["stop", "nope"]) == 1
    assert capsys.readouterr().err == "Error: couldn't find model \"nope\" to unload\n"  # Ollama's words


# -- run ------------------------------------------------------------------------------------------

def chunk(content: str = "", thinking: str | None = None, done: bool = False) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking is not None:
        message["thinking"] = thinking
    return {"model": "m", "message": message, "done": done}


def test_run_one_shot_streams_content_in_order(daemon: FakeDaemon,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    daemon.routes[("POST", "/api/chat")] = (200, [
        chunk(thinking="hmm "), chunk(thinking="ok"), chunk("Hel"), chunk("lo"), chunk(", world"),
        chunk(done=True), chunk("after done is ignored"),
    ])
    assert main(["run", "smollm2", "say", "hi", "--think", "true", "--keepalive", "10m",
                 "--num-predict", "5"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "Hello, world\n"
    assert captured.err == "hmm ok\n"
    assert daemon.bodies("POST", "/api/chat") == [{
        "model": "smollm2", "messages": [{"role": "user", "content": "say hi"}], "stream": True,
        "think": True, "keep_alive": "10m", "options": {"num_predict": 5},
    }]


def test_run_reads_the_prompt_from_stdin(daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    daemon.routes[("POST", "/api/chat")] = (200, [chunk("yes\n"), chunk(done=True)])
    monkeypatch.setattr(sys, "stdin", io.StringIO("line one\nline two\n"))
    assert main(["run", "m"]) == 0
    assert capsys.readouterr().out == "yes\n"
    body = daemon.bodies("POST", "/api/chat")[0]
    assert body["messages"] == [{"role": "user", "content": "line one\nline two\n"}]
    assert "think" not in body and "options" not in body


def test_run_empty_stdin_does_nothing(daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("  \n"))
    assert main(["run", "m"]) == 0
    assert daemon.requests == []


def test_run_in_band_error_exits_1(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.routes[("POST", "/api/chat")] = (200, [chunk("part"), {"error": "llama-server crashed"}])
    assert main(["run", "m", "hi"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "part\n"
    assert captured.err == "Error: llama-server crashed\n"


def test_run_http_error_exits_1(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.routes[("POST", "/api/chat")] = (404, {"error": "model 'docker.io/ai/x:latest' not found"})
    assert main(["run", "x", "hi"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "Error: model 'docker.io/ai/x:latest' not found\n"


def test_run_stream_ending_early_is_an_error(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.routes[("POST", "/api/chat")] = (200, [chunk("cut")])
    assert main(["run", "m", "hi"]) == 1
    assert "closed the stream" in capsys.readouterr().err


def test_run_bad_keepalive(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "m", "hi", "--keepalive", "soon"]) == 1
    assert capsys.readouterr().err.startswith('Error: invalid --keepalive: time: invalid duration "soon"')
    assert daemon.requests == []


def test_interactive_keeps_history_clear_and_multiline(daemon: FakeDaemon,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    daemon.routes[("POST", "/api/chat")] = (200, [chunk("ok"), chunk(done=True)])
    lines = iter(["hi", "", "again", "/clear", '"""first', "second", 'third"""', "/what", "/bye", "never"])

    def read(prompt: str) -> str:
        return next(lines)

    args = build_parser().parse_args(["run", "m"])
    assert interactive_chat(DaemonClient(f"http://127.0.0.1:{daemon.port}"), args, read=read) == 0
    sent = [b["messages"] for b in daemon.bodies("POST", "/api/chat")]
    assert sent == [
        [{"role": "user", "content": "hi"}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
         {"role": "user", "content": "again"}],
        [{"role": "user", "content": "first\nsecond\nthird"}],
    ]
    out = capsys.readouterr().out
    assert "Cleared session context" in out and "/bye" in out
    assert next(lines) == "never"


def test_interactive_ends_on_eof_and_survives_errors(daemon: FakeDaemon,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    daemon.routes[("POST", "/api/chat")] = (500, {"error": "boom"})
    lines = iter(["hi"])

    def read(prompt: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    args = build_parser().parse_args(["run", "m"])
    assert interactive_chat(DaemonClient(f"http://127.0.0.1:{daemon.port}"), args, read=read) == 0
    assert "Error: boom" in capsys.readouterr().err


# -- autostart ------------------------------------------------------------------------------------

def test_ensure_server_uses_a_running_daemon(daemon: FakeDaemon) -> None:
    client = ensure_server(load_settings())
    assert client.version() == "0.1.0"


def test_ensure_server_names_the_log_when_the_daemon_dies(nothing_listening: int, env: Path) -> None:
    settings = load_settings()
    command = [sys.executable, "-c", "import sys; print('serve failed here'); sys.exit(3)"]
    with pytest.raises(LlmmanError) as info:
        ensure_server(settings, command=command)
    log = env / "data" / "serve.log"
    assert str(info.value) == f"llmman serve exited with status 3 before it answered; see {log}"
    assert "serve failed here" in log.read_text()


def test_ensure_server_does_not_start_a_remote_daemon(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMMAN_HOST", "http://192.0.2.1:9")  # TEST-NET: never answers
    monkeypatch.setattr(DaemonClient, "ping", lambda self: False)
    with pytest.raises(DaemonUnreachable, match=re.escape("could not connect to llmman serve at http://192.0.2.1:9")):
        ensure_server(load_settings(), command=[sys.executable, "-c", "raise SystemExit(9)"])
    assert not (env / "data" / "serve.log").exists()


def test_client_connection_refused(nothing_listening: int) -> None:
    client = DaemonClient(f"http://127.0.0.1:{nothing_listening}")
    assert client.ping() is False
    with pytest.raises(DaemonUnreachable, match=re.escape(f"at http://127.0.0.1:{nothing_listening}") + "$"):
        client.tags()


# -- store verbs through the daemon ---------------------------------------------------------------

def test_list_through_the_daemon_with_filter(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    when = (datetime.now(UTC) - timedelta(seconds=150)).isoformat()
    daemon.routes[("GET", "/api/tags")] = (200, {"models": [
        {"name": "docker.io/ai/smollm2:135m", "digest": "a" * 64, "size": 1000, "modified_at": when},
        {"name": "docker.io/ai/smollm2:latest", "digest": "b" * 64, "size": 2000, "modified_at": when},
        {"name": "docker.io/ai/gemma3:latest", "digest": "c" * 64, "size": 3000, "modified_at": when},
    ]})
    assert main(["ls", "smollm2"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "NAME                           ID              SIZE      MODIFIED",
        "docker.io/ai/smollm2:135m      aaaaaaaaaaaa    1.0 kB    2 minutes ago",
        "docker.io/ai/smollm2:latest    bbbbbbbbbbbb    2.0 kB    2 minutes ago",
    ]
    assert main(["list", "smollm2:135m"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_list_empty_prints_the_header(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.routes[("GET", "/api/tags")] = (200, {"models": []})
    assert main(["list"]) == 0
    assert capsys.readouterr().out == "NAME    ID    SIZE    MODIFIED\n"


def test_rm_through_the_daemon(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.routes[("DELETE", "/api/delete")] = (200, None)
    assert main(["rm", "smollm2:135m"]) == 0
    assert capsys.readouterr().out == "Deleted docker.io/ai/smollm2:135m\n"
    assert daemon.bodies("DELETE", "/api/delete") == [{"model": "docker.io/ai/smollm2:135m"}]
    daemon.routes[("DELETE", "/api/delete")] = (404, {"error": "model 'docker.io/ai/x:latest' not found"})
    assert main(["rm", "x", "y"]) == 1
    assert capsys.readouterr().err == ("Error: model 'docker.io/ai/x:latest' not found\n"
                                       "Error: model 'docker.io/ai/y:latest' not found\n")


def test_cp_through_the_daemon(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.routes[("POST", "/api/copy")] = (200, None)
    assert main(["cp", "smollm2", "mine:v1"]) == 0
    assert capsys.readouterr().out == "Copied docker.io/ai/smollm2:latest to docker.io/ai/mine:v1\n"
    assert daemon.bodies("POST", "/api/copy") == [
        {"source": "docker.io/ai/smollm2:latest", "destination": "docker.io/ai/mine:v1"}]


def test_show_through_the_daemon(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    daemon.routes[("POST", "/api/show")] = (200, {
        "modelfile": "FROM x\n", "parameters": "", "template": "{{ .Prompt }}",
        "details": {"family": "llama", "parameter_size": "135M", "quantization_level": "Q8_0"},
        "model_info": {"general.architecture": "llama", "llama.context_length": 8192},
        "capabilities": ["completion"],
    })
    assert main(["show", "smollm2"]) == 0
    out = capsys.readouterr().out
    assert "    architecture        llama\n" in out and "    context length      8192\n" in out
    assert "  Capabilities\n    completion\n" in out
    assert main(["show", "smollm2", "--template"]) == 0
    assert capsys.readouterr().out == "{{ .Prompt }}\n"


# -- store verbs without a daemon -----------------------------------------------------------------

class FakeStore:
    """Stands in for llmman.store.Store: a dict of reference -> model."""

    def __init__(self) -> None:
        digest = "sha256:" + "d" * 64
        self.models: dict[str, SimpleNamespace] = {
            "docker.io/ai/smollm2:135m": SimpleNamespace(
                reference="docker.io/ai/smollm2:135m", digest=digest, size=98_300_000,
                modified_at=datetime.now(UTC).timestamp() - 7200, manifest={"schemaVersion": 2}),
        }

    def list(self) -> list[SimpleNamespace]:
        return list(self.models.values())

    def get(self, ref: object) -> SimpleNamespace | None:
        return self.models.get(str(ref))

    def remove(self, ref: object) -> list[str]:
        if str(ref) not in self.models:
            raise ModelNotFound(str(ref))
        del self.models[str(ref)]
        return []

    def tag(self, src: object, dst: object) -> None:
        self.models[str(dst)] = self.models[str(src)]

    def build(self, ref: object, path: Path, labels: dict[str, str]) -> SimpleNamespace:
        self.built = (str(ref), path, labels)
        return SimpleNamespace(digest="sha256:" + "e" * 64)


@pytest.fixture
def store(nothing_listening: int, monkeypatch: pytest.MonkeyPatch) -> FakeStore:
    fake = FakeStore()
    monkeypatch.setattr(commands_store, "_store", lambda settings: fake)
    return fake


def test_store_verbs_without_a_daemon(store: FakeStore, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "docker.io/ai/smollm2:135m    dddddddddddd    98.3 MB    2 hours ago")
    assert main(["inspect", "smollm2:135m"]) == 0
    assert capsys.readouterr().out == '{\n  "schemaVersion": 2\n}\n'
    assert main(["tag", "smollm2:135m", "copy"]) == 0
    assert capsys.readouterr().out == "Copied docker.io/ai/smollm2:135m to docker.io/ai/copy:latest\n"
    assert main(["rm", "copy", "missing"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "Deleted docker.io/ai/copy:latest\n"
    assert captured.err == "Error: model 'docker.io/ai/missing:latest' not found\n"
    assert main(["inspect", "missing"]) == 1
    assert capsys.readouterr().err == "Error: model 'docker.io/ai/missing:latest' not found\n"
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert main(["build", "-t", "mine:v1", "-l", "k=v", str(gguf)]) == 0
    assert capsys.readouterr().out == f"Built docker.io/ai/mine:v1 (sha256:{'e' * 64})\n"
    assert store.built == ("docker.io/ai/mine:v1", gguf, {"k": "v"})


# -- config ---------------------------------------------------------------------------------------

def test_config_set_get_unset(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "set", "server.num_parallel", "2"]) == 0
    assert "num_parallel = 2" in (env / "config" / "llmman" / "llmman.conf").read_text()
    assert main(["config", "get", "server.num_parallel"]) == 0
    assert capsys.readouterr().out == "2\n"
    assert main(["config", "list", "--show-origin"]) == 0
    assert any(line.endswith("\tserver.num_parallel=2") for line in capsys.readouterr().out.splitlines())
    assert main(["config", "unset", "server.num_parallel"]) == 0
    assert main(["config", "get", "server.num_parallel"]) == 0
    assert capsys.readouterr().out == "4\n"


def test_config_unknown_key(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "get", "server.nope"]) == 1
    assert capsys.readouterr().err == "Error: unknown setting 'server.nope'\n"


def test_store_verbs_on_a_real_store(nothing_listening: int, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    ggufgen = pytest.importorskip("ggufgen")
    gguf = ggufgen.write_gguf(tmp_path / "tiny.gguf")
    store = str(tmp_path / "other-store")
    assert main(["build", "--store", store, "-t", "tiny:1", str(gguf)]) == 0
    assert capsys.readouterr().out.startswith("Built docker.io/ai/tiny:1 (sha256:")
    assert main(["--store", store, "ls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    assert lines[1].startswith("docker.io/ai/tiny:1    ") and lines[1].endswith("just now")
    assert main(["show", "--store", store, "tiny:1"]) == 0
    assert "    architecture        llama\n" in capsys.readouterr().out
    assert main(["show", "--store", store, "tiny:1", "--template"]) == 0
    assert capsys.readouterr().out == ggufgen.CHATML_TEMPLATE + "\n"
    assert main(["inspect", "--store", store, "tiny:1"]) == 0
    assert json.loads(capsys.readouterr().out)["schemaVersion"] == 2
    assert main(["cp", "--store", store, "tiny:1", "tiny:2"]) == 0
    assert main(["rm", "--store", store, "tiny:1", "tiny:1"]) == 1
    captured = capsys.readouterr()
    assert captured.out.endswith("Deleted docker.io/ai/tiny:1\n")
    assert captured.err == "Error: model 'docker.io/ai/tiny:1' not found\n"
    assert main(["ls", "--store", store]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["NAME", "docker.io/ai/tiny:2"]
