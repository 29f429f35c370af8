"""``llmman install-service [--user] [--print]``: write llmman's systemd unit where systemd looks for it.

The unit comes from llmman.cli.units (the one generator, also behind ``deploy/systemd/``) with
``ExecStart=`` naming this llmman by its absolute path (or ``--executable``). The system unit goes to
``/etc/systemd/system/llmman.service`` (root), the user unit (``--user``) to
``~/.config/systemd/user/llmman.service``; ``--unit-dir`` writes elsewhere (a package's staging folder).
It never runs ``systemctl``: it prints the ``daemon-reload`` and ``enable --now`` line to run, so nothing
starts before the administrator has read what was written. An existing unit that differs is replaced only
with ``--force`` (local changes belong in a drop-in: ``systemctl edit llmman``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from llmman.cli.units import SYSTEM_DIR, UNIT_NAME, render, user_dir
from llmman.config.settings import Settings, user_config_path
from llmman.errors import LlmmanError

__all__ = ["cmd_install_service", "in_a_home", "this_llmman"]

# What the system service cannot see: ProtectHome=yes hides the homes, PrivateTmp=yes (DynamicUser implies
# it) gives it its own empty /tmp and /var/tmp.
_HIDDEN = ("/home/", "/root/", "/run/user/", "/tmp/", "/var/tmp/")


def this_llmman(path_env: str) -> str:
    """The absolute path of the ``llmman`` command running now: the script it was started as, else the
    one beside this Python (a virtual environment's ``bin``), else the first on ``path_env`` (``PATH``).
    Symbolic links are kept, so ``/usr/local/bin/llmman`` linked into a venv stays that path.

    Raises:
        LlmmanError: none was found (``python -m llmman`` from a tree with no ``llmman`` script).
    """
    started = Path(sys.argv[0])
    if started.name == "llmman" and started.is_file():
        return os.path.abspath(started)
    beside = Path(sys.executable).parent / "llmman"
    if beside.is_file():
        return str(beside)
    found = shutil.which("llmman", path=path_env)
    if found:
        return os.path.abspath(found)
    raise LlmmanError("cannot tell where the llmman command is installed: name it with --executable PATH")


def _check_runnable(executable: str, *, user: bool, ours: bool) -> None:
    """Refuse a unit whose ``ExecStart=`` cannot run: not an executable file, or (system unit) a program
    in a home directory, which ``ProtectHome=yes`` hides from the service (so is this Python, when
    ``executable`` is this llmman)."""
    if not (os.path.isfile(executable) and os.access(executable, os.X_OK)):
        raise LlmmanError(f"{executable} is not an executable file (ExecStart= must name one)")
    if user:
        return
    problem = _hidden_problem(executable, ours=ours)
    if problem is not None:
        raise LlmmanError(problem)


def _hidden_problem(executable: str, *, ours: bool) -> str | None:
    """Why a system service could not run ``executable`` (or, when it is this llmman, this Python) because
    it lies where the service cannot see, or None."""
    paths = [executable, os.path.realpath(executable)]
    if ours:
        paths.append(os.path.realpath(sys.executable))
    hidden = in_a_home(paths)
    if hidden is None:
        return None
    return (f"{hidden} is in a home directory or a temporary folder, which the system service cannot see "
            "(ProtectHome=yes, PrivateTmp=yes): install llmman outside /home, /root and /tmp (for example "
            "`pipx install --global`, or a virtual environment in /opt linked from /usr/local/bin), or run "
            "it as your own user with `llmman install-service --user`")


def in_a_home(paths: list[str]) -> str | None:
    """The first of ``paths`` under ``/home``, ``/root``, ``/run/user`` (what ``ProtectHome=yes`` hides),
    ``/tmp`` or ``/var/tmp`` (private to the service with ``PrivateTmp=yes``), or None."""
    return next((path for path in paths if path.startswith(_HIDDEN)), None)


def _next_steps(path: Path, *, user: bool, where: Path) -> str:
    """What to run now that the unit is written (``where``: the folder systemd reads it from)."""
    ctl = "systemctl --user" if user else "systemctl"
    lines = [] if path.parent == where else [f"systemd does not read {path.parent}: copy {path} to {where}/"]
    lines.append(f"{ctl} daemon-reload && {ctl} enable --now {UNIT_NAME}")
    if user:
        lines.append("to keep it running while you are logged out: loginctl enable-linger \"$USER\"")
    else:
        lines.append("it reads /etc/llmman/llmman.conf; its store is /var/lib/llmman/store; "
                     "logs: journalctl -u llmman")
    return "\n".join(lines)


def cmd_install_service(args: argparse.Namespace, settings: Settings) -> int:
    """Render the unit (``--print``: on stdout, nothing written) or write it and print the next step.

    Raises:
        LlmmanError: no llmman to run, an ``ExecStart=`` that cannot run, a different unit already there
            without ``--force``, or a folder that cannot be written (the system unit needs root).
    """
    executable = args.executable or this_llmman(settings.environment.path)
    try:
        text = render(executable, user=args.user, grace=settings.shutdown_grace)
    except ValueError as exc:
        raise LlmmanError(str(exc)) from None
    if args.print:
        sys.stdout.write(text)
        if not args.user and not args.executable:  # what writing it would refuse, said but not refused
            problem = _hidden_problem(executable, ours=True)
            if problem is not None:
                print(f"Warning: {problem}", file=sys.stderr)
        return 0
    _check_runnable(executable, user=args.user, ours=not args.executable)
    systemd_dir = user_dir(user_config_path().parent.parent) if args.user else SYSTEM_DIR
    directory = Path(args.unit_dir) if args.unit_dir else systemd_dir
    path = directory / UNIT_NAME
    try:
        existing = path.read_text(encoding="utf-8") if path.exists() else None
        if existing == text:
            print(f"{path} is up to date")
        elif existing is not None and not args.force:
            raise LlmmanError(f"{path} exists and differs from this llmman's unit: --force replaces it "
                              f"(keep local changes in a drop-in: systemctl {'--user ' if args.user else ''}"
                              "edit llmman)")
        else:
            if args.user or args.unit_dir:
                directory.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{UNIT_NAME}.tmp")
            temporary.write_text(text, encoding="utf-8")
            temporary.chmod(0o644)
            temporary.replace(path)  # whole or not at all: systemd never reads half a unit
            print(f"{'replaced' if existing is not None else 'wrote'} {path}")
    except PermissionError as exc:
        if args.user or args.unit_dir:
            raise LlmmanError(f"cannot write {path}: {exc.strerror}") from None
        raise LlmmanError(f"cannot write {path}: the system unit needs root "
                          '(sudo "$(command -v llmman)" install-service), or install a user unit with '
                          "--user") from None
    print(_next_steps(path, user=args.user, where=systemd_dir))
    return 0
