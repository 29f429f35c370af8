"""The interactive side of ``llmman run``: a small chat loop on a terminal.

* ``>>> `` prompt (``... `` inside a multi-line block); line editing and in-session history through the
  stdlib ``readline`` when the platform has it.
* The whole conversation is sent each turn; ``/clear`` forgets it, ``/bye`` (or ``/exit``) and Ctrl-D
  quit, ``/?`` or any other ``/word`` lists the commands.
* ``\"\"\"`` opens a multi-line message and a line ending in ``\"\"\"`` closes it (``\"\"\"one line\"\"\"``
  works too).
* Ctrl-C on the prompt drops the line; during an answer it stops the answer, which is then not kept in
  the history. A daemon error is printed and the loop goes on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from llmman.cli.client import DaemonClient
from llmman.cli.commands_run import chat_body, stream_reply
from llmman.errors import LlmmanError

__all__ = ["HELP", "interactive_chat", "read_message"]

PROMPT = ">>> "
CONTINUATION = "... "
FENCE = '"""'
HELP = """Available commands:
  /clear    Clear the conversation
  /bye      Exit
  /?        Show this help
Use \"\"\" to begin and end a multi-line message."""


def _enable_readline() -> None:
    try:
        import readline  # noqa: F401  (importing it is what turns line editing on for input())
    except ImportError:
        pass


def read_message(read: Callable[[str], str]) -> str:
    """Read one message with ``read(prompt)``: a line, or a ``\"\"\"``-fenced block of lines.

    Raises:
        EOFError: end of input (Ctrl-D), also inside an unfinished block.
    """
    line = read(PROMPT)
    start = line.lstrip()
    if not start.startswith(FENCE):
        return line
    body = start[len(FENCE) :]
    if body.rstrip().endswith(FENCE):
        return body.rstrip()[: -len(FENCE)]
    lines = [body] if body else []
    while True:
        nxt = read(CONTINUATION)
        if nxt.rstrip().endswith(FENCE):
            last = nxt.rstrip()[: -len(FENCE)]
            if last:
                lines.append(last)
            return "\n".join(lines)
        lines.append(nxt)


def interactive_chat(
    client: DaemonClient, args: argparse.Namespace, *, read: Callable[[str], str] | None = None
) -> int:
    """Run the chat loop until ``/bye`` or end of input; returns the exit status (0).

    Args:
        client: a client of a daemon that answers.
        args: the ``run`` arguments (model, think, keepalive, num_predict).
        read: reads a line after showing a prompt (default :func:`input`, with readline).
    """
    if read is None:
        _enable_readline()
        read = input
    messages: list[dict[str, str]] = []
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
        if command.startswith("/") and "\n" not in command:
            word = command.split()[0]
            if word in ("/bye", "/exit"):
                return 0
            if word == "/clear":
                messages.clear()
                print("Cleared session context")
            else:
                print(HELP)
            continue
        messages.append({"role": "user", "content": text})
        try:
            reply = stream_reply(client, chat_body(args, messages))
        except KeyboardInterrupt:
            messages.pop()
            print()
            continue
        except LlmmanError as exc:
            messages.pop()
            print(f"Error: {exc}", file=sys.stderr)
            continue
        messages.append({"role": "assistant", "content": reply})
        print()
