"""What ``llmman serve`` needs that the CLI alone does not: the ``server`` extra's modules.

``pip install llmman`` installs the CLI (the verbs that talk to a daemon, the store verbs, pull and
push); the daemon's dependencies come with ``llmman[server]`` (pyproject.toml). Before anything of the
daemon is imported, :func:`check_server_extra` looks the daemon's modules up (``find_spec``: nothing is
imported) and, when one is missing, raises one line that says what to type for this install
(:mod:`llmman.install`), which the CLI prints as ``Error: ...`` with exit status 1. An extra that is there
but broken (a dependency of a dependency removed, a compiled module built for another Python) fails the
daemon's import instead: :func:`broken_server_extra` turns that ``ImportError`` into the same kind of line.
"""

from __future__ import annotations

import importlib.util

from llmman.errors import LlmmanError
from llmman.install import current

__all__ = ["SERVER_MODULES", "broken_server_extra", "check_server_extra", "missing_server_modules"]

SERVER_MODULES = ("starlette", "uvicorn", "httptools", "aiohttp", "prometheus_client", "psutil", "dns")
"""The modules of the ``server`` extra that the daemon cannot start without (uvloop and pynvml are
optional at run time: asyncio's loop and no NVML discovery stand in). tests/unit/test_install_extras.py
checks this against the daemon's imports and pyproject.toml's extra."""


def missing_server_modules() -> list[str]:
    """The :data:`SERVER_MODULES` that this environment cannot import."""
    return [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]


def check_server_extra(what: str = "llmman serve") -> None:
    """Raise a one-line :class:`LlmmanError` naming the install command when the server extra is missing.

    Args:
        what: the verb that needs it, for the message (``llmman serve``, ``llmman gpu-discover``).
    """
    missing = missing_server_modules()
    if missing:
        raise LlmmanError(f"{what} needs llmman's server extra, which is not installed (no module "
                          f"{missing[0]!r}); install it with: {current().add_server()}")


def broken_server_extra(exc: ImportError, what: str = "llmman serve") -> LlmmanError | None:
    """The one-line error for an ``ImportError`` raised while the daemon's modules load, or None when the
    module that failed is llmman's own (a bug: its traceback is what is needed).

    Args:
        exc: what importing the daemon raised (a third-party module missing or not loadable).
        what: the verb that needs it, for the message.
    """
    name = exc.name or ""
    if name == "llmman" or name.startswith("llmman."):
        return None
    return LlmmanError(f"{what} cannot load llmman's server extra, which is installed but broken ({exc}); "
                       f"reinstall it with: {current().add_server()}")
