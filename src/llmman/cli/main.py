"""``llmman``: the command line. argparse routes each verb to a handler in a ``commands_*`` module.

Only argparse and the chosen handler's module are imported for a verb: ``ps`` and ``list`` pay for
the config, the HTTP client (httpx, imported on first request) and the table formatters, nothing else.
The daemon itself (``serve``) is imported only by ``serve``.

Every handler takes ``(args, settings)`` and returns the exit status. A deliberate error
(:class:`LlmmanError`) prints ``Error: <message>`` on stderr and exits 1; usage errors exit 2
(argparse); Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from llmman import __version__

if TYPE_CHECKING:
    from llmman.config.settings import Settings

__all__ = ["build_parser", "load_cli_settings", "main"]

Handler = Callable[[argparse.Namespace, "Settings"], int]

# verb -> "module:function" (resolved lazily so a verb imports only what it needs).
_HANDLERS = {
    "serve": "commands_daemon:cmd_serve",
    "run": "commands_run:cmd_run",
    "ps": "commands_daemon:cmd_ps",
    "stop": "commands_daemon:cmd_stop",
    "drain": "commands_drain:cmd_drain",
    "undrain": "commands_drain:cmd_undrain",
    "nodes": "commands_nodes:cmd_nodes",
    "logs": "commands_logs:cmd_logs",
    "config": "commands_daemon:cmd_config",
    "list": "commands_store:cmd_list",
    "rm": "commands_store:cmd_rm",
    "tag": "commands_store:cmd_tag",
    "show": "commands_store:cmd_show",
    "inspect": "commands_store:cmd_inspect",
    "build": "commands_store:cmd_build",
    "create": "commands_create:cmd_create",
    "import": "commands_import:cmd_import",
    "verify": "commands_store:cmd_verify",
    "pull": "commands_pull:cmd_pull",
    "push": "commands_pull:cmd_push",
    "login": "commands_pull:cmd_login",
    "logout": "commands_pull:cmd_logout",
    "gpu-discover": "commands_gpu:cmd_gpu_discover",
    "completion": "commands_completion:cmd_completion",
    "install-service": "commands_service:cmd_install_service",
}


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"invalid label {text!r} (expected KEY=VALUE)")
    return key, value


def _think(text: str) -> bool | str:
    value = text.lower()
    if value in ("true", "false"):
        return value == "true"
    if value in ("low", "medium", "high"):
        return value
    raise argparse.ArgumentTypeError(f"invalid think value {text!r} (true, false, low, medium or high)")


def environment_help() -> str:
    """``serve --help``'s list of environment variables, as Ollama prints its ``OLLAMA_*`` ones: each
    setting's variable (from :data:`llmman.config.table.SETTINGS`), its one-line doc and default, and the
    Ollama variable read when it is unset."""
    from llmman.config.table import SETTINGS

    specs = [spec for spec in SETTINGS if spec.env]
    width = max(len(str(spec.env)) for spec in specs) + 2
    lines = ["Environment Variables:"]
    for spec in specs:
        notes = [f"default {spec.default}"] if spec.default else []
        if spec.ollama_env:
            notes.append(f"or {spec.ollama_env}")
        tail = f" ({'; '.join(notes)})" if notes else ""
        lines.append(f"  {str(spec.env).ljust(width)}{spec.doc}{tail}")
    return "\n".join(lines)


class _EnvHelp(argparse.Action):
    """``-h``/``--help`` of ``serve``: the usual help, then :func:`environment_help` (read only when asked,
    so no other verb pays for the settings table)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        parser.epilog = environment_help()
        parser.print_help()
        parser.exit()


def _verb(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help_text: str,
          *, store: bool = False, aliases: tuple[str, ...] = (), handler: str | None = None,
          env_help: bool = False) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_text, description=help_text, aliases=list(aliases),
                            add_help=not env_help, formatter_class=argparse.RawDescriptionHelpFormatter
                            if env_help else argparse.HelpFormatter)
    if env_help:
        parser.add_argument("-h", "--help", action=_EnvHelp, help="show this help message and exit")
    parser.set_defaults(verb=handler or name)
    if store:
        # SUPPRESS: a value given before the verb (the global --store) is not overwritten by a default.
        parser.add_argument("--store", metavar="DIR", default=argparse.SUPPRESS, help="the model store")
    return parser


def _transfer_verbs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``pull``, ``push``, ``login``, ``logout`` (llmman.cli.commands_pull)."""
    for name, text in (("pull", "Pull a model from a registry or Hugging Face"),
                       ("push", "Push a model to a registry")):
        p = _verb(sub, name, text, store=True)
        p.add_argument("ref", metavar="REF")
        p.add_argument("--insecure", action="store_true", help="plain HTTP to the registry")
    p = _verb(sub, "login", "Log in to a registry (default docker.io)")
    p.add_argument("server", nargs="?", metavar="SERVER")
    p.add_argument("-u", "--username", metavar="USER")
    pw = p.add_mutually_exclusive_group()
    pw.add_argument("-p", "--password", metavar="PASS")
    pw.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    p.add_argument("--insecure", action="store_true", help="plain HTTP to the registry")
    p = _verb(sub, "logout", "Log out of a registry")
    p.add_argument("server", nargs="?", metavar="SERVER")


def build_parser() -> argparse.ArgumentParser:
    """The full argparse tree of verbs and flags."""
    parser = argparse.ArgumentParser(prog="llmman", description="Run and manage local LLMs.")
    parser.add_argument("--version", action="version", version=f"llmman {__version__}")
    parser.add_argument("--store", metavar="DIR", default=None, help="the model store (LLMMAN_MODELS)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = _verb(sub, "serve", "Start the llmman daemon", store=True, env_help=True)
    p.add_argument("model", nargs="?", help="a model to load at start")
    p.add_argument("--host", help="address to listen on (LLMMAN_HOST)")

    p = _verb(sub, "run", "Run a model: one prompt, or an interactive chat", store=True)
    p.add_argument("model")
    p.add_argument("prompt", nargs="*", default=[],
                   help="the prompt (else stdin, or interactive); '--' before words that start with '-'")
    p.add_argument("--think", type=_think, help="true, false, low, medium or high")
    p.add_argument("--keepalive", metavar="DUR", help="how long to keep the model loaded (5m, 1h, -1)")
    p.add_argument("--num-predict", type=int, metavar="N", help="maximum tokens to generate")
    p.add_argument("--format", metavar="FORMAT", help='the answer\'s format: "json", or a JSON schema')
    p.add_argument("--verbose", action="store_true", help="show timings and token rates after each answer")
    p.add_argument("--hidethinking", action="store_true", help="do not print the model's thinking")

    _verb(sub, "ps", "List loaded models")
    p = _verb(sub, "stop", "Unload a model")
    p.add_argument("model")
    p = _verb(sub, "drain", "Drain a node: it takes no new work and unloads each model once idle")
    p.add_argument("node", nargs="?", help="the node's name or host:port (default: this one)")
    p.add_argument("--wait", action="store_true", help="return once it has no request and no model left")
    p = _verb(sub, "undrain", "Put a drained node back into service")
    p.add_argument("node", nargs="?", help="the node's name or host:port (default: this one)")
    p = _verb(sub, "nodes", "Show the pool: this node and its peers, their state and load")
    p.add_argument("--json", action="store_true", help="print /llmman/pool as JSON")
    p = _verb(sub, "logs", "Show the daemon's log, or a model's llama-server log, of any node of the pool")
    p.add_argument("model", nargs="?", help="the model whose llama-server log to show (else the daemon's)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until Ctrl-C")
    p.add_argument("-n", "--lines", type=int, default=100, metavar="N", help="print the last N lines first "
                   "(default 100; 0 = none)")
    p.add_argument("--node", help="another node's logs: its name or host:port (default: this one)")

    p = _verb(sub, "list", "List stored models", store=True, aliases=("ls",))
    p.add_argument("filter", nargs="?", help="only this reference (any tag when untagged)")
    p = _verb(sub, "rm", "Remove models", store=True)
    p.add_argument("refs", nargs="+", metavar="REF")
    for name in ("tag", "cp"):
        p = _verb(sub, name, "Give a model another name", store=True, handler="tag")
        p.add_argument("source", metavar="SRC")
        p.add_argument("destination", metavar="DST")

    p = _verb(sub, "show", "Show information about a model", store=True)
    p.add_argument("model")
    part = p.add_mutually_exclusive_group()
    for flag in ("modelfile", "parameters", "template", "license"):
        part.add_argument(f"--{flag}", action="store_true", help=f"show the model's {flag}")
    p.add_argument("--verbose", "-v", action="store_true", help="show all metadata")

    p = _verb(sub, "inspect", "Print a model's OCI manifest", store=True)
    p.add_argument("ref")
    p = _verb(sub, "build", "Package local GGUF files into the store", store=True)
    p.add_argument("-t", "--tag", required=True, metavar="REF")
    p.add_argument("-l", "--label", type=_label, action="append", default=[], metavar="K=V")
    p.add_argument("path", nargs="?", default=".", metavar="PATH")
    p = _verb(sub, "create", "Create a model from a Modelfile", store=True)
    p.add_argument("model", metavar="NAME")
    p.add_argument("-f", "--file", default="Modelfile", metavar="FILE",
                   help="the Modelfile (default: ./Modelfile)")
    p.add_argument("-q", "--quantize", metavar="QUANT", help="not supported: the daemon says why")
    p = _verb(sub, "import", "Use models already on disk (Ollama, Hugging Face, llama.cpp, LM Studio, GGUF "
              "folders) without a second copy", store=True)
    p.add_argument("sources", nargs="*", metavar="SOURCE",
                   help="a folder or GGUF file, or ollama, hf, llama.cpp, lmstudio (default: all found)")
    p.add_argument("--name", metavar="REF", help="the name for the one model a SOURCE holds")
    p.add_argument("-n", "--dry-run", action="store_true", help="list what would be imported, import nothing")
    p = _verb(sub, "verify", "Check every blob of the store (or of MODELs) against its digest", store=True)
    p.add_argument("models", nargs="*", metavar="MODEL")
    p.add_argument("--repair", action="store_true", help="fetch bad or missing blobs again")
    _transfer_verbs(sub)

    _verb(sub, "gpu-discover", "Show the accelerator, its memory and the figure llmman uses")
    p = _verb(sub, "completion", "Print a shell completion script: bash, zsh or fish")
    p.add_argument("shell", choices=("bash", "zsh", "fish"))
    p = _verb(sub, "install-service", "Write llmman's systemd unit (system, or --user) and print how to "
              "start it")
    p.add_argument("--user", action="store_true", help="a user unit (systemctl --user) on your own store")
    p.add_argument("--print", action="store_true", help="print the unit, write nothing")
    p.add_argument("--executable", metavar="PATH", help="the llmman for ExecStart= (default: this one)")
    p.add_argument("--unit-dir", metavar="DIR", help="write it there instead of where systemd looks")
    p.add_argument("--force", action="store_true", help="replace a unit that differs")

    p = _verb(sub, "config", "Show or edit the configuration")
    csub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = csub.add_parser("list", help="every setting with its value")
    c.add_argument("--show-origin", action="store_true", help="where each value comes from")
    c = csub.add_parser("get", help="one setting's value")
    c.add_argument("key")
    c = csub.add_parser("set", help="set a value in the user config file")
    c.add_argument("key")
    c.add_argument("value")
    c = csub.add_parser("unset", help="remove a value from the user config file")
    c.add_argument("key")
    return parser


def _verbs(parser: argparse.ArgumentParser) -> list[str]:
    """Every verb and alias of ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def unknown_verb(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The error for a first word that is no verb, with the close ones (``difflib``), as Ollama's CLI
    (cobra) words it; None when the verb is known (or there is none: argparse says so)."""
    import difflib

    words = iter(argv)
    for word in words:
        if word == "--store":
            next(words, None)
            continue
        if word.startswith("-"):
            continue
        verbs = _verbs(parser)
        if word in verbs:
            return None
        text = f'Error: unknown command "{word}" for "llmman"\n'
        close = difflib.get_close_matches(word, verbs, n=3, cutoff=0.6)
        if close:
            text += "\nDid you mean this?\n" + "".join(f"\t{verb}\n" for verb in close)
        return text + "\nRun 'llmman --help' for usage.\n"
    return None


def load_cli_settings(args: argparse.Namespace) -> Settings:
    """The settings for this invocation: config files and environment, overridden by the flags."""
    from llmman.config.settings import load_settings

    flags: dict[str, object] = {}
    if getattr(args, "store", None):
        flags["server.models"] = args.store
    if getattr(args, "host", None):
        flags["server.host"] = args.host
    return load_settings(flags=flags)


def resolve_handler(verb: str) -> Handler:
    """The handler function for ``verb``, importing its module now."""
    module_name, _, func = _HANDLERS[verb].partition(":")
    module = importlib.import_module(f"llmman.cli.{module_name}")
    handler: Handler = getattr(module, func)
    return handler


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the verb, and return the exit status."""
    from llmman.errors import LlmmanError

    parser = build_parser()
    words = sys.argv[1:] if argv is None else argv
    unknown = unknown_verb(parser, words)
    if unknown is not None:
        print(unknown, file=sys.stderr, end="")
        raise SystemExit(2)  # a usage error, as argparse's own
    args, extra = parser.parse_known_args(words)
    if extra:
        # `llmman run MODEL --num-predict 5 "hi"`: argparse ends the prompt words at the first flag;
        # words after it are still the prompt (Ollama's CLI takes flags anywhere).
        if args.verb == "run" and not any(w.startswith("-") for w in extra):
            args.prompt = [*args.prompt, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        settings = load_cli_settings(args)
        return resolve_handler(args.verb)(args, settings)
    except LlmmanError as exc:
        _flush_stdout()
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _flush_stdout()
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `llmman ls | head`: the reader went away; say nothing more, not even at interpreter exit.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # e.g. a read-only store: the OS's words, no traceback
        _flush_stdout()
        where = f": {exc.filename}" if exc.filename else ""
        print(f"Error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
