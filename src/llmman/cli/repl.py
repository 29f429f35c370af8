"""The interactive side of ``llmman run``: a small chat loop on a terminal, with Ollama's commands.

* ``>>> `` prompt (``... `` inside a multi-line block); line editing and in-session history through the
  stdlib ``readline`` when the platform has it.
* The whole conversation is sent each turn, after the session's system message; ``/clear`` forgets the
  conversation (not the system message), ``/bye`` (or ``/exit``) and Ctrl-D quit, ``/?`` or any other
  ``/word`` lists the commands.
* ``/set parameter NAME VALUE`` adds an option to every request (``stop`` takes several values), ``/set
  system TEXT`` sets the system message, ``/set verbose|quiet``, ``/set format json|noformat``, ``/set
  think|nothink`` change the ``run`` flags for the session.
* ``/show info`` prints what ``llmman show`` does; ``/show license|modelfile|parameters|system|template``
  one part of it.
* ``/load MODEL`` switches model (loading it, as ``llmman run`` does) and starts a new conversation; the
  system message and parameters stay. ``/save NAME`` creates a model from the current one with the
  session's system message, parameters and conversation (``POST /api/create``, as Ollama's ``/save``).
* ``\"\"\"`` opens a multi-line message (also after ``/set system``) and a line ending in ``\"\"\"`` closes it
  (``\"\"\"one line\"\"\"`` works too).
* Ctrl-C on the prompt drops the line; during an answer it stops the answer, which is then not kept in
  the history. A daemon error is printed and the loop goes on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmman.cli.client import DaemonClient
from llmman.cli.commands_run import chat_body, print_metrics, stream_reply
from llmman.cli.modelfile import LIST_PARAMETERS, parameter_value
from llmman.errors import LlmmanError

__all__ = ["HELP", "Session", "interactive_chat", "read_message"]

PROMPT = ">>> "
CONTINUATION = "... "
FENCE = '"""'
HELP = """Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /save <model>   Save your current session
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command

Use \"\"\" to begin a multi-line message."""
SET_HELP = """Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set format json       Enable JSON mode
  /set noformat          Disable formatting
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
  /set think             Enable thinking
  /set nothink           Disable thinking"""
PARAMETER_HELP = """Available Parameters:
  /set parameter seed <int>             Random number seed
  /set parameter num_predict <int>      Max number of tokens to predict
  /set parameter top_k <int>            Pick from top k num of tokens
  /set parameter top_p <float>          Pick token based on sum of probabilities
  /set parameter min_p <float>          Pick token based on top token probability * min_p
  /set parameter num_ctx <int>          Set the context size
  /set parameter temperature <float>    Set creativity level
  /set parameter repeat_penalty <float> How strongly to penalize repetitions
  /set parameter repeat_last_n <int>    Set how far back to look for repetitions
  /set parameter num_gpu <int>          The number of layers to send to the GPU
  /set parameter stop <string> <string> ...   Set the stop parameters"""
SHOW_HELP = """Available Commands:
  /show info         Show details for this model
  /show license      Show model license
  /show modelfile    Show Modelfile for this model
  /show parameters   Show parameters for this model
  /show system       Show system message
  /show template     Show prompt template"""


def _enable_readline() -> None:
    try:
        import readline  # noqa: F401  (importing it is what turns line editing on for input())
    except ImportError:
        pass


def read_message(read: Callable[[str], str]) -> str:
    """Read one message with ``read(prompt)``: a line, or a ``\"\"\"``-fenced block of lines (the fence may
    follow ``/set system``).

    Raises:
        EOFError: end of input (Ctrl-D), also inside an unfinished block.
    """
    line = read(PROMPT)
    start = line.lstrip()
    prefix = ""
    if start.startswith("/set system ") and start[len("/set system "):].lstrip().startswith(FENCE):
        prefix, start = "/set system ", start[len("/set system "):].lstrip()
    if not start.startswith(FENCE):
        return line
    body = start[len(FENCE) :]
    if body.rstrip().endswith(FENCE):
        return prefix + body.rstrip()[: -len(FENCE)]
    lines = [body] if body else []
    while True:
        nxt = read(CONTINUATION)
        if nxt.rstrip().endswith(FENCE):
            last = nxt.rstrip()[: -len(FENCE)]
            if last:
                lines.append(last)
            return prefix + "\n".join(lines)
        lines.append(nxt)


@dataclass
class Session:
    """What the chat loop keeps: the ``run`` arguments (a copy: ``/load`` and ``/set`` change it), the
    system message, the ``/set parameter`` options, and the conversation."""

    args: argparse.Namespace
    system: str = ""
    options: dict[str, object] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)

    def request(self) -> dict[str, Any]:
        """The ``/api/chat`` body for the next turn: the system message first, then the conversation."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return chat_body(self.args, [*head, *self.messages], self.options)

    def save_body(self, name: str) -> dict[str, Any]:
        """The ``/api/create`` body of ``/save NAME``: the current model with the session's system message,
        parameters (the ``--num-predict`` flag's too) and conversation."""
        body: dict[str, Any] = {"model": name, "from": self.args.model}
        if self.system:
            body["system"] = self.system
        options = dict(self.request().get("options") or {})
        if options:
            body["parameters"] = options
        if self.messages:
            body["messages"] = list(self.messages)
        return body


def option_problem(name: str, value: object) -> str | None:
    """What the daemon would say of ``options: {name: value}`` (the same checks,
    llmman.protocol.ollama.fields), or None when it takes it; a chat request ignores an unknown option, so
    ``/set parameter`` refuses it here, as Ollama's does."""
    from llmman.protocol.ollama.fields import options_to_sampling, runner_options, unknown_options

    candidate = {name: value}
    if unknown_options(candidate):
        return f"unknown parameter '{name}'"
    try:
        options_to_sampling(candidate)
        runner_options(candidate)
    except LlmmanError as exc:
        return exc.message
    return None


def _set(session: Session, words: list[str], text: str) -> None:
    """``/set ...``: see the module docstring; prints what changed, as Ollama does."""
    args = session.args
    what = words[1] if len(words) > 1 else ""
    if what == "parameter":
        if len(words) < 4:
            print(PARAMETER_HELP)
            return
        name, values = words[2], words[3:]
        value = values if name in LIST_PARAMETERS else parameter_value(values[0])
        problem = option_problem(name, value)
        if problem:
            print(f"Couldn't set parameter: {problem}")
            return
        session.options[name] = value
        print(f"Set parameter '{name}' to '{', '.join(values)}'")  # Ollama's words
    elif what == "system":
        session.system = text.split(None, 2)[2] if len(words) > 2 else ""
        print("Set system message.")
    elif what in ("verbose", "quiet"):
        args.verbose = what == "verbose"
        print(f"Set '{what}' mode.")
    elif what == "format" and words[2:] == ["json"]:
        args.format = "json"
        print("Set format to 'json' mode.")
    elif what == "noformat":
        args.format = None
        print("Disabled format.")
    elif what in ("think", "nothink"):
        args.think = what == "think"
        print(f"Set '{what}' mode.")
    elif what:
        print(f"Unknown command '/set {what}'. Type /? for help")
    else:
        print(SET_HELP)


def _show(client: DaemonClient, session: Session, what: str) -> None:
    """``/show ...``: the daemon's ``/api/show`` for the current model, formatted as ``llmman show``."""
    if what not in ("info", "license", "modelfile", "parameters", "system", "template"):
        print(SHOW_HELP)
        return
    data = client.show(session.args.model)
    if what == "info":
        from llmman.cli.tables import format_show

        print(format_show(data))
        return
    if what == "parameters" and session.options:
        print("User defined parameters:")
        for name, value in session.options.items():
            print(f"{name:<30} {value}")  # Ollama's layout
        print("\nModel defined parameters:")
    text = session.system if what == "system" and session.system else str(data.get(what) or "")
    print(text.rstrip("\n") if text else f"No {what} was specified for this model.")


def _load(client: DaemonClient, session: Session, model: str) -> None:
    """``/load MODEL``: load it (the daemon fetches it when it can) and start a new conversation."""
    from llmman.cli.coldstart import load

    print(f"Loading model '{model}'")
    try:
        load(client, model, keep_alive=session.args.keepalive)
    except LlmmanError as exc:
        if exc.status == 404:
            print(f"Couldn't find model '{model}'")
            return
        raise
    session.args.model = model
    session.messages.clear()


def _save(client: DaemonClient, session: Session, name: str) -> None:
    """``/save NAME``: ``POST /api/create`` with :meth:`Session.save_body`."""
    for line in client.ndjson_stream("/api/create", session.save_body(name)):
        if line.get("error"):
            raise LlmmanError(str(line["error"]))
    print(f"Created new model '{name}'")


def _command(client: DaemonClient, session: Session, text: str) -> bool:
    """Run one ``/`` command; False when it ends the chat."""
    words = text.split()
    word = words[0]
    if word in ("/bye", "/exit"):
        return False
    if word == "/clear":
        session.messages.clear()
        print("Cleared session context")
    elif word == "/set":
        _set(session, words, text)
    elif word == "/show":
        _show(client, session, words[1] if len(words) > 1 else "")
    elif word in ("/load", "/save") and len(words) != 2:
        print(f"Usage:\n  {word} <modelname>")
    elif word == "/load":
        _load(client, session, words[1])
    elif word == "/save":
        _save(client, session, words[1])
    elif word in ("/?", "/help") and words[1:2] == ["set"]:
        print(SET_HELP)
    elif word in ("/?", "/help") and words[1:2] == ["show"]:
        print(SHOW_HELP)
    else:
        print(HELP)
    return True


def interactive_chat(
    client: DaemonClient, args: argparse.Namespace, *, read: Callable[[str], str] | None = None
) -> int:
    """Run the chat loop until ``/bye`` or end of input; returns the exit status (0).

    Args:
        client: a client of a daemon that answers.
        args: the ``run`` arguments (model, think, keepalive, num_predict, format, verbose, hidethinking).
        read: reads a line after showing a prompt (default :func:`input`, with readline).
    """
    if read is None:
        _enable_readline()
        read = input
    session = Session(argparse.Namespace(**vars(args)))
    while True:
        try:
            text = read_message(read)
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            continue
        command = text.strip()
        if not command:
            continue
        if command.startswith("/") and ("\n" not in command or command.startswith("/set system ")):
            try:
                if not _command(client, session, command):
                    return 0
            except LlmmanError as exc:
                print(f"Error: {exc}", file=sys.stderr)
            continue
        session.messages.append({"role": "user", "content": text})
        try:
            reply = stream_reply(client, session.request(),
                                 hide_thinking=bool(getattr(session.args, "hidethinking", False)))
        except KeyboardInterrupt:
            session.messages.pop()
            print()
            continue
        except LlmmanError as exc:
            session.messages.pop()
            print(f"Error: {exc}", file=sys.stderr)
            continue
        session.messages.append({"role": "assistant", "content": reply.text})
        if getattr(session.args, "verbose", False):
            print_metrics(reply)
        print()
