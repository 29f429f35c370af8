"""``llmman run MODEL [PROMPT...]``: one prompt, or an interactive chat on a terminal.

The daemon is started when nothing answers (:func:`llmman.cli.autostart.ensure_server`). Each turn is
one streamed ``POST /api/chat``: ``message.content`` goes to stdout as it arrives, ``message.thinking``
to stderr (dimmed on a terminal). One-shot when prompt words are given or stdin is not a terminal (all
of stdin is the prompt; an empty prompt does nothing).

A cold start talks on a terminal (llmman.cli.coldstart): a model no node stores is pulled with progress
bars first, and until the first chunk of the answer one line on stderr says what is waited for (pulling,
copying from a peer, loading on node X), then is cleared. Piped, only the answer is printed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from llmman.cli.autostart import ensure_server
from llmman.cli.client import DaemonClient
from llmman.cli.coldstart import load, prepare

if TYPE_CHECKING:
    from llmman.config.settings import Settings

__all__ = ["chat_body", "cmd_run", "stream_reply"]

_DIM = "\x1b[2m"
_RESET = "\x1b[0m"


def chat_body(args: argparse.Namespace, messages: list[dict[str, str]]) -> dict[str, Any]:
    """The ``/api/chat`` request for ``messages`` with the ``run`` flags (think, keep_alive, num_predict)."""
    body: dict[str, Any] = {"model": args.model, "messages": messages, "stream": True}
    if args.think is not None:
        body["think"] = args.think
    if args.keepalive is not None:
        body["keep_alive"] = args.keepalive
    if args.num_predict is not None:
        body["options"] = {"num_predict": args.num_predict}
    return body


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def stream_reply(
    client: DaemonClient, body: dict[str, Any], out: TextIO | None = None, err: TextIO | None = None,
    on_first: Callable[[], None] | None = None,
) -> str:
    """Stream one chat turn: content to ``out`` as it arrives, thinking to ``err``; end ``out`` with a
    newline. ``on_first`` is called once, before the first chunk is written or when the turn ends without
    one (it clears the cold-start line). Returns the full content (for the conversation history).

    Raises:
        LlmmanError: the daemon's error, before or during the stream (after a newline on ``out``).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    dim = _isatty(err)
    parts: list[str] = []
    thinking = False
    done = False
    try:
        for chunk in client.chat_stream(body):
            if on_first is not None:
                on_first()
                on_first = None
            message = chunk.get("message") or {}
            thought = message.get("thinking")
            if thought:
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
        text = "".join(parts)
        if (done or text) and not text.endswith("\n"):
            out.write("\n")
        out.flush()
    return text


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman run``: ensure a daemon, then one-shot or interactive chat."""
    if args.keepalive is not None:
        from llmman.durations import parse_duration
        from llmman.errors import BadRequest

        try:
            parse_duration(args.keepalive, what="keepalive")
        except BadRequest as exc:
            raise BadRequest(f"invalid --keepalive: {exc}") from None
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
        if waiting is None:
            stream_reply(client, chat_body(args, [{"role": "user", "content": prompt}]))
        else:
            with waiting:
                stream_reply(client, chat_body(args, [{"role": "user", "content": prompt}]),
                             on_first=waiting.stop)
    return 0
