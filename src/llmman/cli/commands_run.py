"""``llmman run MODEL [PROMPT...]``: one prompt, or an interactive chat on a terminal.

The daemon is started when nothing answers (:func:`llmman.cli.autostart.ensure_server`). Each turn is
one streamed ``POST /api/chat``: ``message.content`` goes to stdout as it arrives, ``message.thinking``
to stderr (dimmed on a terminal; not at all with ``--hidethinking``). One-shot when prompt words are given
or stdin is not a terminal (all of stdin is the prompt; an empty prompt does nothing).

Flags as Ollama's: ``--format json`` (or a JSON schema) is sent as ``format``; ``--verbose`` prints, after
the answer and on stderr, the final line's timings and token rates (:func:`llmman.cli.tables.format_metrics`).

A cold start talks on a terminal (llmman.cli.coldstart): a model no node stores is pulled with progress
bars first, and until the first chunk of the answer one line on stderr says what is waited for (pulling,
copying from a peer, loading on node X), then is cleared. Piped, only the answer is printed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from llmman.cli.autostart import ensure_server
from llmman.cli.client import DaemonClient
from llmman.cli.coldstart import load, prepare

if TYPE_CHECKING:
    from llmman.config.settings import Settings

__all__ = ["Reply", "chat_body", "cmd_run", "parse_format", "print_metrics", "stream_reply"]

_DIM = "\x1b[2m"
_RESET = "\x1b[0m"


@dataclass
class Reply:
    """One streamed turn: the answer's ``text``, and its ``final`` line (``done: true``, with the
    metrics; empty when the stream broke off)."""

    text: str = ""
    final: dict[str, Any] = field(default_factory=dict)


def parse_format(text: str | None) -> object:
    """``--format``: ``json``, or a JSON schema object; None when not given.

    Raises:
        BadRequest: anything else.
    """
    if text is None or text == "":
        return None
    if text == "json":
        return "json"
    import json

    from llmman.errors import BadRequest

    try:
        schema = json.loads(text)
    except ValueError:
        schema = None
    if not isinstance(schema, dict):
        raise BadRequest(f'invalid --format {text!r}: "json" or a JSON schema object')
    return schema


def chat_body(args: argparse.Namespace, messages: list[dict[str, str]],
              options: dict[str, object] | None = None) -> dict[str, Any]:
    """The ``/api/chat`` request for ``messages`` with the ``run`` flags (think, keep_alive, num_predict,
    format); ``options`` (the REPL's ``/set parameter``) are sent too, over ``--num-predict``."""
    body: dict[str, Any] = {"model": args.model, "messages": messages, "stream": True}
    if args.think is not None:
        body["think"] = args.think
    if args.keepalive is not None:
        body["keep_alive"] = args.keepalive
    sent: dict[str, object] = {}
    if args.num_predict is not None:
        sent["num_predict"] = args.num_predict
    sent.update(options or {})
    if sent:
        body["options"] = sent
    fmt = parse_format(getattr(args, "format", None))
    if fmt is not None:
        body["format"] = fmt
    return body


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def stream_reply(
    client: DaemonClient, body: dict[str, Any], out: TextIO | None = None, err: TextIO | None = None,
    on_first: Callable[[], None] | None = None, *, hide_thinking: bool = False,
) -> Reply:
    """Stream one chat turn: content to ``out`` as it arrives, thinking to ``err`` (unless
    ``hide_thinking``); end ``out`` with a newline. ``on_first`` is called once, before the first chunk is
    written or when the turn ends without one (it clears the cold-start line). Returns the full content
    (for the conversation history) and the final line.

    Raises:
        LlmmanError: the daemon's error, before or during the stream (after a newline on ``out``).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    dim = _isatty(err)
    reply = Reply()
    parts: list[str] = []
    thinking = False
    done = False
    try:
        for chunk in client.chat_stream(body):
            if on_first is not None:
                on_first()
                on_first = None
            if chunk.get("done"):
                reply.final = chunk
            message = chunk.get("message") or {}
            thought = message.get("thinking")
            if thought and not hide_thinking:
                if not thinking and dim:
                    err.write(_DIM)
                thinking = True
                err.write(str(thought))
                err.flush()
            content = message.get("content")
            if content:
                if thinking:
                    err.write((_RESET if dim else "") + "\n")
                    err.flush()
                    thinking = False
                parts.append(str(content))
                out.write(str(content))
                out.flush()
        done = True
    finally:
        if on_first is not None:
            on_first()
        if thinking:
            err.write((_RESET if dim else "") + "\n")
            err.flush()
        reply.text = "".join(parts)
        if (done or reply.text) and not reply.text.endswith("\n"):
            out.write("\n")
        out.flush()
    return reply


def print_metrics(reply: Reply, err: TextIO | None = None) -> None:
    """``--verbose``: a blank line, then the turn's timings (:func:`llmman.cli.tables.format_metrics`) on
    ``err`` (default stderr), as Ollama prints them."""
    from llmman.cli.tables import format_metrics

    err = err or sys.stderr
    text = format_metrics(reply.final)
    if text:
        err.write("\n" + text)
        err.flush()


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman run``: ensure a daemon, then one-shot or interactive chat."""
    if args.keepalive is not None:
        from llmman.durations import parse_duration
        from llmman.errors import BadRequest

        try:
            parse_duration(args.keepalive, what="keepalive")
        except BadRequest as exc:
            raise BadRequest(f"invalid --keepalive: {exc}") from None
    parse_format(args.format)  # a bad --format is said before anything starts
    prompt = " ".join(args.prompt)
    interactive = not prompt and _isatty(sys.stdin)
    if not prompt and not interactive:
        prompt = sys.stdin.read()
        if not prompt.strip():
            return 0
    client = ensure_server(settings, store=getattr(args, "store", None))
    with client:
        waiting = prepare(client, args.model, aliases=settings.aliases, out=sys.stdout, err=sys.stderr)
        if interactive:
            from llmman.cli.repl import interactive_chat

            if waiting is not None:  # load it before the first prompt, saying so
                with waiting:
                    load(client, args.model, keep_alive=args.keepalive)
            return interactive_chat(client, args)
        body = chat_body(args, [{"role": "user", "content": prompt}])
        if waiting is None:
            reply = stream_reply(client, body, hide_thinking=args.hidethinking)
        else:
            with waiting:
                reply = stream_reply(client, body, on_first=waiting.stop, hide_thinking=args.hidethinking)
        if args.verbose:
            print_metrics(reply)
    return 0
