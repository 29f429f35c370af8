"""The Ollama user's habits on the command line, in-process: a mistyped verb, ``serve --help``'s variables,
``completion`` scripts, ``run --verbose``'s timings, ``--hidethinking``, ``--format`` and the REPL's
``/set``, ``/show`` and ``/save`` (the daemon is tests.unit.test_cli_main's FakeDaemon, recording what it is
sent; the same behaviours against a real daemon are in tests/integration/test_cli_ollama.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.unit.test_cli_main import FakeDaemon

from llmman.cli.client import DaemonClient
from llmman.cli.main import build_parser, main
from llmman.cli.repl import interactive_chat, read_message
from llmman.cli.tables import format_metrics, go_duration
from llmman.config.table import SETTINGS


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeDaemon]:
    for key in list(os.environ):
        if key.startswith(("LLMMAN_", "OLLAMA_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    d = FakeDaemon()
    d.thread.start()
    monkeypatch.setenv("LLMMAN_HOST", f"127.0.0.1:{d.port}")
    yield d
    d.server.shutdown()
    d.server.server_close()


# -- a mistyped verb ------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "close"), [
    (["sevre"], ["serve"]), (["--store", "/s", "lsit"], ["list", "ls"]), (["pul", "x"], ["pull"]),
    (["xyzzy"], []),
])
def test_a_mistyped_verb_suggests_the_close_ones(argv: list[str], close: list[str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    word = next(w for w in argv if not w.startswith("-") and w != "/s")
    assert err.startswith(f'Error: unknown command "{word}" for "llmman"\n')
    suggested = err.split("Did you mean this?\n", 1)[1].split("\n\n")[0].split() if close else []
    assert suggested == close
    assert ("Did you mean this?" in err) is bool(close)


# -- serve --help ---------------------------------------------------------------------------------

def test_serve_help_lists_every_environment_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: llmman serve" in out
    listed = out.split("Environment Variables:\n", 1)[1].splitlines()
    for spec in SETTINGS:
        if spec.env:
            [line] = [line for line in listed if line.split()[0] == spec.env]
            assert spec.doc in line
            if spec.ollama_env:
                assert f"or {spec.ollama_env}" in line
    assert len(listed) == sum(1 for spec in SETTINGS if spec.env)


def test_other_verbs_help_lists_no_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["ps", "--help"])
    assert "Environment Variables" not in capsys.readouterr().out


# -- completion -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("shell", "mark"), [
    ("bash", "complete -o bashdefault -F _shtab_llmman llmman"), ("zsh", "#compdef llmman"),
    ("fish", "complete -c llmman"),
])
def test_completion_scripts(shell: str, mark: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == 0
    out = capsys.readouterr().out
    assert mark in out
    assert "llmman list" in out  # stored model names, for the verbs that take one
    for verb in ("serve", "run", "create", "completion"):
        assert verb in out


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_sources_the_script_and_completes_verbs(tmp_path: Path) -> None:
    script = tmp_path / "llmman.bash"
    done = subprocess.run([sys.executable, "-m", "llmman", "completion", "bash"], capture_output=True,
                          text=True, timeout=60, check=True)
    script.write_text(done.stdout)
    probe = (f"set -e; source {script}; COMP_WORDS=(llmman se); COMP_CWORD=1; _shtab_llmman llmman se llmman;"
             ' printf "%s\\n" "${COMPREPLY[@]}"; COMP_WORDS=(llmman run m --hide); COMP_CWORD=3;'
             ' _shtab_llmman llmman --hide m; printf "%s\\n" "${COMPREPLY[@]}"')
    ran = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    assert ran.stdout.split() == ["serve", "--hidethinking"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_the_shell_itself_reads_the_script(shell: str, tmp_path: Path) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    done = subprocess.run([sys.executable, "-m", "llmman", "completion", shell], capture_output=True,
                          text=True, timeout=60, check=True)
    (tmp_path / "script").write_text(done.stdout)
    check = ["zsh", "-n", str(tmp_path / "script")] if shell == "zsh" else \
        ["fish", "--no-execute", str(tmp_path / "script")]
    ran = subprocess.run(check, capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr


# -- run --verbose, --hidethinking, --format ------------------------------------------------------

@pytest.mark.parametrize(("ns", "text"), [
    (0, "0s"), (850, "850ns"), (1_500, "1.5µs"), (30_291_000, "30.291ms"), (245_000_000, "245ms"),
    (1_560_291_000, "1.560291s"), (1_000_000_000, "1s"), (123_500_000_000, "2m3.5s"),
    (3_600_000_000_000, "1h0m0s"), (-2_000_000, "-2ms"),
])
def test_durations_as_go_prints_them(ns: int, text: str) -> None:
    assert go_duration(ns) == text


def test_metrics_as_ollama_prints_them() -> None:
    final = {"done": True, "total_duration": 1_560_291_000, "load_duration": 30_291_000,
             "prompt_eval_count": 26, "prompt_eval_duration": 245_000_000, "eval_count": 27,
             "eval_duration": 1_280_000_000}
    assert format_metrics(final) == (
        "total duration:       1.560291s\n"
        "load duration:        30.291ms\n"
        "prompt eval count:    26 token(s)\n"
        "prompt eval duration: 245ms\n"
        "prompt eval rate:     106.12 tokens/s\n"
        "eval count:           27 token(s)\n"
        "eval duration:        1.28s\n"
        "eval rate:            21.09 tokens/s\n")
    assert format_metrics({"done": True, "eval_count": 3}) == "eval count:           3 token(s)\n"
    assert format_metrics({}) == ""


def _chunk(content: str = "", thinking: str | None = None, **final: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking is not None:
        message["thinking"] = thinking
    return {"model": "m", "message": message, "done": bool(final), **final}


def test_run_verbose_hidethinking_and_format(fake: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    fake.routes[("POST", "/api/chat")] = (200, [
        _chunk(thinking="secret plan"), _chunk('{"a": 1}'),
        _chunk(total_duration=2_000_000_000, eval_count=4, eval_duration=500_000_000),
    ])
    assert main(["run", "m", "hi", "--verbose", "--hidethinking", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert captured.out == '{"a": 1}\n'
    assert "secret plan" not in captured.err
    assert captured.err == ("\ntotal duration:       2s\neval count:           4 token(s)\n"
                            "eval duration:        500ms\neval rate:            8.00 tokens/s\n")
    assert fake.bodies("POST", "/api/chat")[0]["format"] == "json"


def test_run_format_schema_and_a_bad_format(fake: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    fake.routes[("POST", "/api/chat")] = (200, [_chunk("{}"), _chunk(total_duration=1)])
    assert main(["run", "m", "hi", "--format", '{"type": "object"}']) == 0
    assert fake.bodies("POST", "/api/chat")[0]["format"] == {"type": "object"}
    assert main(["run", "m", "hi", "--format", "yaml"]) == 1
    assert 'invalid --format \'yaml\': "json" or a JSON schema object' in capsys.readouterr().err
    assert len(fake.bodies("POST", "/api/chat")) == 1


# -- the REPL -------------------------------------------------------------------------------------

def _lines(*lines: str) -> Any:
    feed = iter(lines)

    def read(prompt: str) -> str:
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    return read


def test_set_system_takes_a_fenced_block() -> None:
    assert read_message(_lines('/set system """one', "two", 'three"""')) == "/set system one\ntwo\nthree"
    assert read_message(_lines('/set system """inline"""')) == "/set system inline"
    assert read_message(_lines("/set system plain")) == "/set system plain"


def test_repl_sends_the_session_and_saves_it(fake: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    fake.routes[("POST", "/api/chat")] = (200, [_chunk("ok"), _chunk(eval_count=1)])
    fake.routes[("POST", "/api/create")] = (200, [{"status": "writing manifest"}, {"status": "success"}])
    fake.routes[("POST", "/api/show")] = (200, {"system": "model's own", "parameters": "top_k 40",
                                                "details": {"family": "llama"}})
    args = build_parser().parse_args(["run", "m", "--num-predict", "9"])
    read = _lines("/set parameter temperature 0.2", "/set parameter stop A B", "/set system Be brief.",
                  "/set nothink", "hello", "/show system", "/show parameters", "/show nonsense",
                  "/set parameter", "/save mine", "/clear", "again", "/bye")
    assert interactive_chat(DaemonClient(f"http://127.0.0.1:{fake.port}"), args, read=read) == 0
    first, second = fake.bodies("POST", "/api/chat")
    system = {"role": "system", "content": "Be brief."}
    assert first["messages"] == [system, {"role": "user", "content": "hello"}]
    assert first["options"] == {"num_predict": 9, "temperature": 0.2, "stop": ["A", "B"]}
    assert first["think"] is False
    assert second["messages"] == [system, {"role": "user", "content": "again"}]  # /clear keeps the system
    assert fake.bodies("POST", "/api/create") == [{
        "model": "mine", "from": "m", "system": "Be brief.",
        "parameters": {"num_predict": 9, "temperature": 0.2, "stop": ["A", "B"]},
        "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "ok"}],
    }]
    out = capsys.readouterr().out
    for said in ("Set parameter 'temperature' to '0.2'", "Set parameter 'stop' to 'A, B'",
                 "Set system message.", "Set 'nothink' mode.", "Created new model 'mine'",
                 "User defined parameters:", "temperature                    0.2",
                 "Model defined parameters:\ntop_k 40",
                 "/show info         Show details for this model", "Available Parameters:"):
        assert said in out, said
    assert "Be brief.\n" in out  # /show system: the session's


def test_set_parameter_refuses_what_the_daemon_would(fake: FakeDaemon,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    fake.routes[("POST", "/api/chat")] = (200, [_chunk("ok"), _chunk(eval_count=1)])
    args = build_parser().parse_args(["run", "m"])
    read = _lines("/set parameter bogus 1", "/set parameter top_k high", "/set parameter top_k 5", "hi")
    assert interactive_chat(DaemonClient(f"http://127.0.0.1:{fake.port}"), args, read=read) == 0
    out = capsys.readouterr().out
    assert "Couldn't set parameter: unknown parameter 'bogus'" in out
    assert 'Couldn\'t set parameter: option "top_k" must be of type integer' in out
    assert [b["options"] for b in fake.bodies("POST", "/api/chat")] == [{"top_k": 5}]
