"""Verbs about the daemon itself and the configuration: ``serve``, ``ps``, ``stop``, ``config``.

``ps`` and ``stop`` never start a daemon: with nothing running there is nothing loaded, and the
error says how to start one.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from llmman.cli.client import DaemonClient, DaemonUnreachable, client_for
from llmman.errors import ConfigError, LlmmanError, NotFound

if TYPE_CHECKING:
    from llmman.config.settings import Settings

__all__ = ["cmd_config", "cmd_ps", "cmd_serve", "cmd_stop"]

_START_HINT = "start it with 'llmman serve'"


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman serve [MODEL]``: run the daemon in the foreground until SIGTERM/SIGINT.

    Without the ``server`` extra this is one line saying what to install (exit 1); without a
    llama-server, the daemon's own message names the three ways to get one (runner/binary.py).
    """
    from llmman.cli.serve_check import broken_server_extra, check_server_extra

    check_server_extra()
    try:
        from llmman.daemon import serve  # imported here: the server's dependencies only load for `serve`
    except ImportError as exc:  # the extra is there but a module of it does not load
        error = broken_server_extra(exc)
        if error is None:
            raise
        raise error from None

    return int(serve(settings, preload=args.model))


def _client(settings: Settings) -> DaemonClient:
    return client_for(settings)


def cmd_ps(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman ps``: the loaded models as a table (NAME ID SIZE PROCESSOR CONTEXT STARTED [NODE] UNTIL)."""
    from llmman.cli.tables import ps_table

    with _client(settings) as client:
        try:
            models = client.ps()
        except DaemonUnreachable as exc:
            raise DaemonUnreachable(exc.url, _START_HINT) from None
    sys.stdout.write(ps_table(models, datetime.now(UTC)))
    return 0


def cmd_stop(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman stop MODEL``: unload the model (``/api/generate`` with ``keep_alive: 0``)."""
    with _client(settings) as client:
        try:
            client.unload(args.model)
        except DaemonUnreachable as exc:
            raise DaemonUnreachable(exc.url, _START_HINT) from None
        except LlmmanError as exc:
            if exc.status == 404:  # Ollama's wording (cmd/cmd.go StopHandler)
                raise NotFound(f'couldn\'t find model "{args.model}" to unload') from None
            raise
    return 0


def _check_key(key: str) -> None:
    """Refuse a key that is neither a setting nor ``aliases.<name>``, with the CLI's wording."""
    from llmman.config.settings import SETTINGS

    section, _, name = key.partition(".")
    if key in {spec.key for spec in SETTINGS} or (section == "aliases" and name.strip("\"'")):
        return
    raise ConfigError(f"unknown setting '{key}'")


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman config list [--show-origin] | get KEY | set KEY VALUE | unset KEY``.

    ``set`` and ``unset`` edit the user file (``~/.config/llmman/llmman.conf``), keeping its comments.
    """
    from llmman.config import settings as config

    if args.action == "list":
        for key, value, origin in config.config_list(settings):
            print(f"{origin}\t{key}={value}" if args.show_origin else f"{key}={value}")
        return 0
    _check_key(args.key)
    if args.action == "get":
        print(config.config_get(settings, args.key))
    elif args.action == "set":
        config.config_set(args.key, args.value, config.user_config_path())
    else:
        config.config_unset(args.key, config.user_config_path())
    return 0
