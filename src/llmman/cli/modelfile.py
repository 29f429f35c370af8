"""Ollama's Modelfile, read by ``llmman create`` and turned into the body ``POST /api/create`` accepts.

The syntax is Ollama's (``parser/parser.go``): one instruction per line, its name case-insensitive, ``#``
starting a comment line; a value runs to the end of its line, or is a ``"..."`` or ``\"\"\"...\"\"\"``
string that may span lines. ``PARAMETER NAME VALUE`` and ``MESSAGE ROLE TEXT`` take a word before the
value. What each instruction becomes in the body (:func:`create_body`):

* ``FROM`` a model name -> ``from``; a GGUF file, or a folder of them, that exists (relative to the
  Modelfile's folder, ``~`` expanded) -> ``files`` once uploaded (:class:`CreateRequest.paths`).
* ``PARAMETER`` -> ``parameters`` (:func:`parameter_value`: ``stop`` collects every line into a list).
* ``SYSTEM`` (the last one wins), ``MESSAGE`` (``system``, ``user`` or ``assistant``, in order), ``LICENSE``
  (each one a list entry).
* ``TEMPLATE`` and ``ADAPTER`` are refused with the reason ``/api/create`` gives
  (:data:`llmman.api.create_body.UNSUPPORTED`); Ollama's newer ``DRAFT``, ``RENDERER``, ``PARSER`` and
  ``REQUIRES`` are refused too, never silently dropped. One ``TEMPLATE`` is taken: the base model's own
  chat template, as ``llmman show --modelfile`` writes it (:func:`check_template`), so that a Modelfile
  generated from a model can be edited and created again, as Ollama users do.

Types of parameter values are left to the daemon, which checks them once for every client
(:func:`llmman.api.create_body.check_create_body`): a value here is only read as a number or a boolean when
it looks like one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmman.errors import BadRequest
from llmman.store.imports.found import is_gguf

__all__ = ["CreateRequest", "Instruction", "ModelfileError", "check_template", "create_body",
           "parameter_value", "parse_modelfile"]

#: Every instruction Ollama's parser knows (the ones llmman refuses included, so they get a reason).
COMMANDS = ("from", "license", "template", "system", "adapter", "draft", "renderer", "parser", "parameter",
            "message", "requires")
ROLES = ("system", "user", "assistant")
_INVALID = ('command must be one of "from", "license", "template", "system", "adapter", "draft", '
            '"renderer", "parser", "parameter", "message", or "requires"')
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
LIST_PARAMETERS = ("stop",)  # Ollama's only array option: every PARAMETER line adds one entry


class ModelfileError(BadRequest):
    """A Modelfile that cannot be read (its line number in the message, as Ollama writes it)."""

    code = "invalid_modelfile"


@dataclass(frozen=True)
class Instruction:
    """One instruction: ``name`` lower-cased, ``word`` the parameter name or message role, ``value``
    unquoted, ``line`` where it starts (1-based)."""

    name: str
    value: str
    line: int
    word: str = ""


def _error(line: int, message: str) -> ModelfileError:
    return ModelfileError(f"(line {line}): {message}")


def _unquote(text: str) -> str | None:
    """``text`` without its ``\"\"\"`` or ``"`` quotes; None while a quoted string is still open."""
    if text.startswith('"""'):
        return text[3:-3] if len(text) >= 6 and text.endswith('"""') else None
    if text.startswith('"'):
        return text[1:-1] if len(text) >= 2 and text.endswith('"') else None
    return text


class _Reader:
    """A cursor over the Modelfile's text, counting lines."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self) -> str:
        char = self.peek()
        self.pos += 1
        if char == "\n":
            self.line += 1
        return char

    def word(self, allowed: str) -> str:
        """The run of characters from ``allowed`` (a regex class) at the cursor."""
        match = re.compile(f"[{allowed}]*").match(self.text, self.pos)
        assert match is not None  # a * pattern always matches
        self.pos = match.end()
        return match.group()

    def skip_blanks(self) -> None:
        while self.peek() in (" ", "\t") and self.peek():
            self.pos += 1

    def value(self, start: int) -> str:
        """The value from the cursor: up to a newline where the text so far is complete (a quoted string
        closed), as Ollama's parser reads it."""
        buffer: list[str] = []
        while True:
            char = self.take()
            if char in ("\n", ""):
                text = _unquote("".join(buffer).strip())
                if text is not None:
                    return text
                if not char:
                    raise _error(start, "unexpected end of file inside a quoted value")
            buffer.append(char)


def parse_modelfile(text: str) -> list[Instruction]:
    """The instructions of a Modelfile, in order.

    Raises:
        ModelfileError: an unknown instruction, a ``PARAMETER`` without a name, a ``MESSAGE`` role that is
            not ``system``/``user``/``assistant``, an unclosed quote, or no ``FROM`` line.
    """
    reader = _Reader(text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n"))
    out: list[Instruction] = []
    while reader.peek():
        char = reader.peek()
        if char in (" ", "\t", "\n"):
            reader.take()
            continue
        line = reader.line
        if char == "#":
            while reader.peek() not in ("\n", ""):
                reader.take()
            continue
        name = reader.word("A-Za-z").lower()
        if name not in COMMANDS or reader.peek() not in (" ", "\t"):
            raise _error(line, _INVALID)
        reader.skip_blanks()
        word = ""
        if name == "parameter":
            word = reader.word("A-Za-z0-9_")
            if not word or reader.peek() not in (" ", "\t"):
                raise _error(line, "PARAMETER needs a name and a value")
            reader.skip_blanks()
        elif name == "message":
            word = reader.word("A-Za-z")
            if word not in ROLES or reader.peek() not in (" ", "\t"):
                raise _error(line, 'message role must be one of "system", "user", or "assistant"')
            reader.skip_blanks()
        out.append(Instruction(name, reader.value(line), line, word))
    if not any(i.name == "from" for i in out):
        raise ModelfileError("no FROM line")
    return out


def parameter_value(text: str) -> object:
    """A parameter's value as JSON: ``true``/``false`` a boolean, an integer or a decimal number a
    number, anything else the text (the daemon says when a type is wrong). A number too long for Python
    to convert (past 4300 digits) or too large for a float stays text too, so the daemon's refusal names
    it instead of the command failing with a traceback."""
    if text in ("true", "false"):
        return text == "true"
    try:
        if _INT.fullmatch(text):
            return int(text)
        if _FLOAT.fullmatch(text) and math.isfinite(number := float(text)):
            return number
    except ValueError:  # int(): more digits than sys.get_int_max_str_digits()
        pass
    return text


@dataclass
class CreateRequest:
    """What a Modelfile asks of ``/api/create``: ``body`` (without ``model`` and ``files``), and the local
    files to upload (``paths``) whose digests become ``files``."""

    body: dict[str, Any] = field(default_factory=dict)
    paths: list[Path] = field(default_factory=list)
    template: Instruction | None = None  # taken only when it is the base's own (check_template)


def _refusal(instruction: Instruction) -> str | None:
    """Why llmman refuses ``instruction``, or None when it takes it."""
    from llmman.api.create_body import UNSUPPORTED

    reasons = {"template": UNSUPPORTED["template"], "adapter": UNSUPPORTED["adapters"]}
    if instruction.name == "template":
        reasons["template"] += (" (a TEMPLATE equal to the model's own, as 'llmman show --modelfile' writes "
                                "it, is accepted)")
    if instruction.name in reasons:
        return f"{instruction.name.upper()} is not supported by llmman: {reasons[instruction.name]}"
    if instruction.name in ("draft", "renderer", "parser", "requires"):
        return f"{instruction.name.upper()} is not supported by llmman"
    return None


def _local(source: str, base: Path) -> list[Path] | None:
    """The GGUF files ``FROM source`` names on this machine (a file, or a folder's ``*.gguf``), or None
    when nothing is there (then it is a model name). Each must begin with the GGUF magic: any other file
    (``FROM /etc/shadow``) is refused here, before its bytes are uploaded to the daemon's store.

    Raises:
        BadRequest: a folder without a GGUF file; a file that is not a readable GGUF; a path (``/``,
            ``./``, ``../``, ``~`` or ``.gguf``) where nothing is.
    """
    path = Path(source).expanduser()
    if not path.is_absolute():
        path = base / path
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.glob("*.gguf") if p.is_file())
        if not files:
            raise BadRequest(f"{source}: no GGUF file in this folder")
    elif source.startswith(("/", "./", "../", "~")) or source.lower().endswith(".gguf"):
        raise BadRequest(f"{source}: no such file or folder")  # a path, not a model name
    else:
        return None
    for file in files:
        if not is_gguf(file):
            raise BadRequest(f"{file}: not a GGUF file (or not readable)")
    return files


def create_body(instructions: list[Instruction], base: Path) -> CreateRequest:
    """The ``/api/create`` request for ``instructions`` (see the module docstring); ``base`` is the folder
    relative paths in ``FROM`` start from (the Modelfile's).

    Raises:
        ModelfileError: an instruction llmman refuses (with the reason and its line).
    """
    request = CreateRequest()
    body = request.body
    parameters: dict[str, object] = {}
    messages: list[dict[str, str]] = []
    licenses: list[str] = []
    for instruction in instructions:
        if instruction.name == "template":
            request.template = instruction  # judged against the base's own (check_template)
            continue
        refusal = _refusal(instruction)
        if refusal:
            raise _error(instruction.line, refusal)
        if instruction.name == "from":
            files = _local(instruction.value, base)
            if files is None:
                body["from"] = instruction.value
            else:
                request.paths += [f for f in files if f not in request.paths]
        elif instruction.name == "system":
            body["system"] = instruction.value
        elif instruction.name == "license":
            licenses.append(instruction.value)
        elif instruction.name == "message":
            messages.append({"role": instruction.word, "content": instruction.value})
        elif instruction.word in LIST_PARAMETERS:
            kept = parameters.setdefault(instruction.word, [])
            assert isinstance(kept, list)
            kept.append(instruction.value)
        else:
            parameters[instruction.word] = parameter_value(instruction.value)
    if parameters:
        body["parameters"] = parameters
    if messages:
        body["messages"] = messages
    if licenses:
        body["license"] = licenses
    return request


def check_template(request: CreateRequest, own: str | None) -> None:
    """Drop ``request``'s ``TEMPLATE`` when it is ``own``, the base model's chat template (what
    ``llmman show --modelfile`` writes); refuse any other.

    Raises:
        ModelfileError: a template llmman cannot apply (the reason of :data:`UNSUPPORTED`, with its line).
    """
    template = request.template
    if template is None:
        return
    if own is not None and template.value.strip() == own.strip():
        request.template = None
        return
    refusal = _refusal(template)
    assert refusal is not None
    raise _error(template.line, refusal)
