"""Children that die with the daemon.

A SIGTERM'd daemon stops its children itself; a SIGKILL'd one cannot. On Linux each child asks the
kernel for ``PR_SET_PDEATHSIG`` = SIGKILL (prctl(2)) between fork and exec, so an ``llama-server``
never outlives the daemon that started it. Elsewhere this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive SIGKILL when its parent dies, or None where the
    platform has no ``prctl`` (everything but Linux). libc is resolved here, in the parent, so the
    hook itself only makes one system call in the forked child."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    sig = int(signal.SIGKILL)

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return hook
