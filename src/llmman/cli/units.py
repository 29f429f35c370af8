"""The systemd units ``llmman install-service`` writes: one generator (:func:`render`) for the system unit
and the user unit, so ``deploy/systemd/`` (rendered with ``ExecStart=/usr/local/bin/llmman``) and an
installed unit never drift apart.

Both are ``Type=notify`` (the daemon says ``READY=1`` once it listens, llmman.sdnotify), with a watchdog
the daemon pings only while ``GET /health``'s check passes, ``Restart=on-failure``, and ``KillMode=mixed``:
systemd sends SIGTERM to llmman alone, llmman stops its ``llama-server`` children itself, and whatever is
left when ``TimeoutStopSec=`` (above the shutdown grace) runs out is killed. The system unit runs as a
dynamic user ``llmman`` with its store under ``StateDirectory=llmman`` (``/var/lib/llmman/store``) and the
sandboxing a GPU allows; the user unit runs as the user, on the user's own store and config, with what a
user manager can enforce. docs/service.md says how to install, read the logs and upgrade.
"""

from __future__ import annotations

import math
from pathlib import Path

__all__ = ["SYSTEM_DIR", "UNIT_NAME", "render", "stop_timeout", "user_dir"]

UNIT_NAME = "llmman.service"
SYSTEM_DIR = Path("/etc/systemd/system")  # where an administrator's own units go (systemd.unit(5))
WATCHDOG_SEC = 30  # the daemon pings every 15 s while healthy; two failed checks in a row are a restart
DEFAULT_GRACE = 30.0  # server.shutdown_grace's default: deploy/systemd/ is rendered with it

_HEAD = """\
# llmman, the local LLM server: the {kind} service. Written by `llmman install-service{flag}`;
# change it with `systemctl {scope}edit llmman` (a drop-in that survives a re-install), not here.
# Install, logs, upgrade: docs/service.md in the llmman repository.
[Unit]
Description=llmman local LLM server
{after}\
# a daemon that keeps failing (its start, its watchdog) ends as failed instead of restarting forever
StartLimitIntervalSec=5min
StartLimitBurst=5

[Service]
# READY=1 once it listens, STOPPING=1 at SIGTERM, WATCHDOG=1 while GET /health's check passes
Type=notify
NotifyAccess=main
ExecStart={executable} serve
WatchdogSec={watchdog}s
Restart=on-failure
RestartSec=5s
# SIGTERM goes to llmman alone: it finishes answers for the shutdown grace, then stops its llama-server
# children itself (SIGTERM, 10 s, SIGKILL); what is left after TimeoutStopSec is killed
KillMode=mixed
TimeoutStopSec={stop}s
"""

_SYSTEM = """\
# a dynamic user "llmman" (a static user of that name is used if there is one) that owns only its state
DynamicUser=yes
User=llmman
Group=llmman
# GPUs: AMD's /dev/kfd and /dev/dri/renderD* belong to render and video; NVIDIA's /dev/nvidia* are open to
# all. No PrivateDevices=: it hides every GPU device node. No ProtectClock=: before systemd 253 it implies a
# DeviceAllow= list, which shuts out every device not on it, GPUs included.
SupplementaryGroups=video render
StateDirectory=llmman
StateDirectoryMode=0750
Environment=LLMMAN_MODELS=%S/llmman/store
# HOME in the state directory too: CUDA's kernel cache (~/.nv) and other ~ paths stay writable and private
Environment=HOME=%S/llmman
WorkingDirectory=%S/llmman
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
NoNewPrivileges=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectHostname=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
RestrictNamespaces=yes
LockPersonality=yes
ProtectProc=invisible
CapabilityBoundingSet=
# AF_NETLINK: getaddrinfo(3) asks the kernel for the host's addresses (peers by name)
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
SystemCallArchitectures=native
# no MemoryDenyWriteExecute=: CUDA and ROCm compile GPU kernels into executable memory at run time;
# no SystemCallFilter= and no ProcSubset=pid: GPU drivers' calls vary by vendor and version, and the
# memory figures come from /proc/meminfo and /proc/driver (add them in a drop-in once checked on a host)
UMask=0077
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
"""

_USER = """\
# the user's own store and config (~/.local/share/llmman/store, ~/.config/llmman/llmman.conf), as
# `llmman serve` run by hand. A user manager cannot mount namespaces (ProtectSystem=, PrivateTmp=) without
# unprivileged user namespaces, which would also remap the GPU device nodes' owners: so only this, which
# needs none. No LimitNOFILE=: above the user manager's hard limit it would stop the service starting.
NoNewPrivileges=yes

[Install]
WantedBy=default.target
"""


def stop_timeout(grace: float) -> int:
    """``TimeoutStopSec=`` in seconds for a shutdown grace of ``grace`` seconds (``server.shutdown_grace``):
    a minute above it, for the cut answers' margin and the children's 10 s stop, and never under 90 s.
    The daemon also sends ``EXTEND_TIMEOUT_USEC`` at ``STOPPING=1`` for a grace raised later."""
    return max(90, math.ceil(min(grace, 86400.0)) + 60)


def render(executable: str, *, user: bool, grace: float = DEFAULT_GRACE) -> str:
    """The unit text: ``ExecStart=EXECUTABLE serve`` (an absolute path), the system unit or (``user``) the
    user unit, ``TimeoutStopSec=`` from :func:`stop_timeout`.

    Raises:
        ValueError: ``executable`` is not an absolute path (systemd requires one) or holds a character a
            unit line cannot carry as is (whitespace, quotes, ``%``, ``$``, a backslash).
    """
    if not executable.startswith("/"):
        raise ValueError(f"the llmman executable must be an absolute path, not {executable!r}")
    if any(ch.isspace() or ch in "\"'%$\\;" for ch in executable):
        raise ValueError(f"the llmman executable's path {executable!r} holds a character a unit cannot "
                         "carry as is: install llmman at a plainer path, or name one with --executable")
    head = _HEAD.format(
        kind="user" if user else "system",
        flag=" --user" if user else "",
        scope="--user " if user else "",
        after="" if user else "After=network-online.target\nWants=network-online.target\n",
        executable=executable,
        watchdog=WATCHDOG_SEC,
        stop=stop_timeout(grace),
    )
    return head + (_USER if user else _SYSTEM)


def user_dir(config_home: Path) -> Path:
    """Where a user's own units go: ``$XDG_CONFIG_HOME/systemd/user`` (``config_home``, normally
    ``~/.config``), first in a user manager's search path (systemd.unit(5))."""
    return config_home / "systemd" / "user"
