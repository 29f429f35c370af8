"""Ollama's Modelfile syntax (llmman.cli.modelfile) and the ``/api/create`` body it becomes, which the
daemon's own check (llmman.api.create_body.check_create_body) must accept."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmman.api.create_body import check_create_body
from llmman.cli.modelfile import (
    Instruction,
    ModelfileError,
    check_template,
    create_body,
    parameter_value,
    parse_modelfile,
)
from llmman.errors import BadRequest

FULL = '''# comments and blank lines are skipped

from smollm2:135m
PARAMETER temperature 0.7
parameter num_ctx 2048
PARAMETER stop "<|im_end|>"
PARAMETER stop User:
PARAMETER use_mmap false
System """You are Mario.
Answer as Mario, the assistant, only."""
MESSAGE user Is Toronto in Canada?
MESSAGE assistant "yes, it is"
LICENSE MIT
license """second
license"""
'''


def test_every_instruction_reaches_the_body_the_daemon_accepts(tmp_path: Path) -> None:
    request = create_body(parse_modelfile(FULL), tmp_path)
    assert request.paths == []
    assert request.body == {
        "from": "smollm2:135m",
        "parameters": {"temperature": 0.7, "num_ctx": 2048, "stop": ["<|im_end|>", "User:"],
                       "use_mmap": False},
        "system": "You are Mario.\nAnswer as Mario, the assistant, only.",
        "messages": [{"role": "user", "content": "Is Toronto in Canada?"},
                     {"role": "assistant", "content": "yes, it is"}],
        "license": ["MIT", "second\nlicense"],
    }
    check_create_body({"model": "mario", **request.body})  # raises on anything /api/create refuses


def test_instructions_keep_their_lines_and_words() -> None:
    parsed = parse_modelfile('FROM m\r\n\r\nPARAMETER seed 42\r\n'
                             'MESSAGE system """a\r\nb"""\r\nSYSTEM x # y\n')
    assert parsed == [
        Instruction("from", "m", 1),
        Instruction("parameter", "42", 3, "seed"),
        Instruction("message", "a\nb", 4, "system"),
        Instruction("system", "x # y", 6),  # a # inside a value is text
    ]


def test_a_byte_order_mark_and_tabs_are_fine() -> None:
    assert parse_modelfile("\ufeffFROM\tm\n") == [Instruction("from", "m", 1)]


@pytest.mark.parametrize(("text", "message"), [
    ("FROM m\nADAPTER ./lora.gguf\n", "(line 2): ADAPTER is not supported by llmman: LoRA adapters"),
    ("FROM m\nDRAFT ./small.gguf\n", "(line 2): DRAFT is not supported by llmman"),
])
def test_refused_instructions_say_why(text: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ModelfileError) as info:
        create_body(parse_modelfile(text), tmp_path)
    assert info.value.message.startswith(message)


@pytest.mark.parametrize(("text", "message"), [
    ("FROM m\nCOPY x y\n", '(line 2): command must be one of "from"'),
    ("FROM\n", '(line 1): command must be one of "from"'),
    ("FROM m\nMESSAGE robot hi\n", '(line 2): message role must be one of "system", "user", or "assistant"'),
    ("FROM m\nPARAMETER temperature\n", "(line 2): PARAMETER needs a name and a value"),
    ('FROM m\nSYSTEM """never closed\nstill open\n', "(line 2): unexpected end of file"),
    ('FROM m\nSYSTEM "open\n', "(line 2): unexpected end of file"),
    ("# nothing but a comment\nSYSTEM hi\n", "no FROM line"),
])
def test_parse_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ModelfileError) as info:
        parse_modelfile(text)
    assert info.value.message.startswith(message)
    assert info.value.status == 400


def test_from_a_local_file_or_folder_is_uploaded_a_name_is_not(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    weights = tmp_path / "models" / "a.gguf"
    weights.write_bytes(b"GGUF")
    (tmp_path / "models" / "b.gguf").write_bytes(b"GGUF")
    (tmp_path / "models" / "README").write_text("not a model")
    assert create_body(parse_modelfile("FROM ./models/a.gguf\n"), tmp_path).paths == [weights]
    folder = create_body(parse_modelfile("FROM models\n"), tmp_path)
    assert [p.name for p in folder.paths] == ["a.gguf", "b.gguf"] and "from" not in folder.body
    assert create_body(parse_modelfile(f"FROM {weights}\n"), Path("/elsewhere")).paths == [weights]
    for missing in ("./models/c.gguf", "/nonexistent/x.gguf", "~/nowhere", "c.gguf"):  # a path, nothing there
        with pytest.raises(BadRequest, match="no such file or folder"):
            create_body(parse_modelfile(f"FROM {missing}\n"), tmp_path)
    named = create_body(parse_modelfile("FROM smollm2:135m\n"), tmp_path)  # a name
    assert named.paths == [] and named.body["from"] == "smollm2:135m"
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadRequest, match="no GGUF file"):
        create_body(parse_modelfile("FROM empty\n"), tmp_path)


@pytest.mark.parametrize(("text", "value"), [
    ("42", 42), ("-1", -1), ("0.5", 0.5), (".5", 0.5), ("1e3", 1000.0), ("true", True), ("false", False),
    ("hello", "hello"), ("1.2.3", "1.2.3"),
])
def test_parameter_values(text: str, value: object) -> None:
    assert parameter_value(text) == value
    assert type(parameter_value(text)) is type(value)


OWN = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def test_a_template_is_taken_only_when_it_is_the_models_own(tmp_path: Path) -> None:
    generated = f'FROM m\nTEMPLATE """{OWN}"""\nPARAMETER stop "<|im_end|>"\n'  # as show --modelfile writes
    request = create_body(parse_modelfile(generated), tmp_path)
    check_template(request, OWN + "\n")
    assert request.template is None and "template" not in request.body
    assert request.body["parameters"] == {"stop": ["<|im_end|>"]}
    for own in ("{{ .Prompt }}", None):
        other = create_body(parse_modelfile(generated), tmp_path)
        with pytest.raises(ModelfileError) as info:
            check_template(other, own)
        assert info.value.message.startswith(
            "(line 2): TEMPLATE is not supported by llmman: llama-server uses the chat template inside")
        assert "equal to the model's own" in info.value.message
