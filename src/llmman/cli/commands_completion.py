"""``llmman completion bash|zsh|fish``: a shell completion script, generated from the argparse tree by
``shtab`` (static: verbs, flags and choices), plus the names of stored models for the verbs that take one.

The model names are a small dynamic part: where a verb takes a stored model (``run``, ``show``, ``stop``,
``rm``, ``push``, ``tag``/``cp``, ``list``, ``verify``), the script runs ``llmman list`` and offers its
NAME column. Install it as each shell expects::

    llmman completion bash > ~/.local/share/bash-completion/completions/llmman
    llmman completion zsh > "${fpath[1]}/_llmman"
    llmman completion fish > ~/.config/fish/completions/llmman.fish
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmman.config.settings import Settings

__all__ = ["MODEL_ARGUMENTS", "cmd_completion", "script"]

#: (verb, positional dest) that name a stored model.
MODEL_ARGUMENTS = frozenset({
    ("run", "model"), ("show", "model"), ("stop", "model"), ("rm", "refs"), ("push", "ref"),
    ("tag", "source"), ("cp", "source"), ("list", "filter"), ("verify", "models"), ("inspect", "ref"),
    ("logs", "model"),
})
#: The stored models' names: the NAME column of ``llmman list`` (nothing when it fails).
LIST_MODELS = "llmman list 2>/dev/null | tail -n +2 | cut -d ' ' -f 1"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def script(shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    import shtab

    from llmman.cli.main import build_parser

    parser = build_parser()
    models = shtab.cmd(LIST_MODELS)
    for verb, sub in _subparsers(parser).items():
        for action in sub._actions:
            if (verb, action.dest) in MODEL_ARGUMENTS:
                action.complete = models  # type: ignore[attr-defined]  # shtab's attribute
    text: str = shtab.complete(parser, shell=shell)
    return text


def cmd_completion(args: argparse.Namespace, settings: Settings) -> int:
    """``llmman completion SHELL``: print the script on stdout."""
    sys.stdout.write(script(args.shell))
    return 0
