"""A ready llama-server child without a process, for the scheduler's unit tests: the whole
llmman.sched.plan.Runner Protocol (the launchers in tests return it as a Runner, so mypy holds it to
every member the scheduler and the gateway read)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llmman.runner.crash import Cause
from llmman.sched.plan import Runner


class StubRunner:
    """Stands for a ready child at ``base_url``: :meth:`stop` sets ``stopped`` (and ``exited``);
    :meth:`crash` dies on its own as a real child does (``exit_cause``, ``exited``, then ``on_exit``)."""

    def __init__(self, base_url: str, pid: int | None,
                 on_exit: Callable[[Runner], None] | None = None) -> None:
        self.base_url = base_url
        self.pid = pid
        self.on_exit = on_exit
        self.stopped = asyncio.Event()
        self.exited = asyncio.Event()
        self.exit_cause: Cause | None = None
        self.exit_detail: str | None = None
        self.log_lines: list[str] = []

    def log_tail(self, n: int = 20) -> list[str]:
        return self.log_lines[-n:] if n > 0 else []

    async def stop(self, grace: float = 10.0) -> None:
        self.stopped.set()
        self.exited.set()

    def crash(self, cause: Cause = Cause.UNKNOWN, detail: str | None = None) -> None:
        self.exit_cause, self.exit_detail = cause, detail
        self.exited.set()
        if self.on_exit is not None:
            self.on_exit(self)
