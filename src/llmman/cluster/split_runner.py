"""A split model's child: one ``llama-server --rpc`` (llmman.runner.process.LlamaServerProcess) and the RPC
workers it runs on, as one llmman.sched.plan.Runner.

:class:`SplitRunner` holds the workers' leases (llmman.sched.plan.WorkerLeases) for as long as the child
lives: it watches them from the moment the child is ready, releases them when the child stops for any
reason (an unload or expiry through :meth:`SplitRunner.stop`, a crash, the daemon's exit), and ends the
child when a worker is lost (its lender answered a renewal with 404 or stopped answering): the child is
killed, so the scheduler sees it die (its ``on_exit``) and the requests in flight get the in-band error
the gateway gives for a dead child. The leases are spent then; a plan on them is never started again
(the next request plans the split afresh, llmman.gateway). :func:`child_spec` gives the child its split
flags.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import replace

from llmman.cluster.split import device_split, local_parts
from llmman.runner.argv import LaunchSpec
from llmman.runner.crash import Cause
from llmman.sched.plan import ModelPlan, Runner, WorkerLeases

__all__ = ["SplitRunner", "child_spec"]

log = logging.getLogger("llmman.cluster.split")


def child_spec(spec: LaunchSpec, plan: ModelPlan) -> LaunchSpec:
    """``spec`` (the child's flags as for any model, llmman.daemon.launch_spec) with ``plan``'s split: its
    workers (``--rpc``), ``-ngl``, and a ``--tensor-split`` over llama.cpp's devices in its order — the
    workers' parts, then, when this node's share runs on its GPUs (Split.local_slots), those GPUs' parts
    in the order the child sees them (llmman.cluster.split.device_split over where admission placed it),
    with no CPU pin of the output head (:attr:`LaunchSpec.keep_local`). Never ``-sm none`` / ``-mg``: in
    llama.cpp's single-device mode every device but the main one, the RPC ones too, is dropped. ``spec``
    itself for a plan that is not split.

    A model asked to stay off this node's GPUs (``num_gpu`` 0: ``-dev none``, llmman.runner.argv.load_args)
    gets ``-dev RPC0,RPC1,…`` instead: ``-dev none`` drops the RPC devices too (measured with the bundled
    build: every tensor on this node's CPU, the worker unused), a list of them keeps only them."""
    split = plan.split
    if split is None:
        return spec
    parts = device_split(split.tensor_split, split.local_slots, local_parts(plan.placement, plan.devices))
    extra, kept, i = spec.extra_args, list[str](), 0
    while i < len(extra):
        if extra[i:i + 2] == _DEV_NONE:
            i += 2
            continue
        kept.append(extra[i])
        i += 1
    if len(kept) < len(extra):
        extra = (*kept, "-dev", ",".join(f"RPC{n}" for n in range(len(split.endpoints))))
    return replace(spec, rpc=split.endpoints, n_gpu_layers=split.n_gpu_layers,
                   tensor_split=tuple(float(p) for p in parts), split_mode=None, main_gpu=None,
                   keep_local=not split.local_slots, extra_args=extra)


_DEV_NONE = ("-dev", "none")


class SplitRunner:
    """A llama-server child started on leased RPC workers.

    Args:
        leases: the workers (already leased; not yet watched).
        on_exit: the scheduler's callback for a child that dies on its own; called with this runner.

    The process is given with :meth:`attach` once it is ready; the launcher passes :meth:`child_exited`
    as the process's own ``on_exit``.
    """

    def __init__(self, leases: WorkerLeases, on_exit: Callable[[Runner], None]) -> None:
        self.leases = leases
        self._on_exit = on_exit
        self._child: Runner | None = None
        self._lost: str | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def attach(self, child: Runner) -> None:
        """The ready child: from now on the leases are renewed and a lost worker ends it."""
        self._child = child
        self.leases.watch(self._worker_lost)

    @property
    def child(self) -> Runner:
        if self._child is None:
            raise RuntimeError("the split child is not started")
        return self._child

    # -- llmman.sched.plan.Runner, by delegation ----------------------------------------------------------

    @property
    def base_url(self) -> str:
        return self.child.base_url

    @property
    def pid(self) -> int | None:
        return self.child.pid

    @property
    def exited(self) -> asyncio.Event:
        return self.child.exited

    @property
    def exit_cause(self) -> Cause | None:
        return self.child.exit_cause

    @property
    def exit_detail(self) -> str | None:
        """Why the split ended when a worker was lost, else the child's own detail."""
        if self._lost is not None:
            return f"split ended: {self._lost}"
        return self.child.exit_detail

    @property
    def log_lines(self) -> list[str]:
        return self.child.log_lines

    def log_tail(self, n: int = 20) -> list[str]:
        return self.child.log_tail(n)

    def progressed(self) -> None:
        """Bytes came from the child (runner.health's progress), passed on."""
        progressed = getattr(self._child, "progressed", None)
        if progressed is not None:
            progressed()

    async def stop(self, grace: float = 10.0) -> None:
        """Stop the child, then release its workers (``on_exit`` is not called). Idempotent."""
        try:
            if self._child is not None:
                await self._child.stop(grace)
        finally:
            await self.leases.release()

    # -- the split's own events ----------------------------------------------------------------------

    def child_exited(self, child: Runner) -> None:
        """The process died on its own (a crash, or killed by :meth:`_worker_lost`): release the workers and
        tell the scheduler, as any child's death."""
        if self._child is None:
            self._child = child
        self._spawn(self.leases.release())
        self._on_exit(self)

    def _worker_lost(self, why: str) -> None:
        """A worker is gone: end the child now (SIGKILL to its process group); its exit is reported through
        :meth:`child_exited`."""
        if self._lost is not None or self._child is None:
            return
        self._lost = why
        pid = self._child.pid
        log.warning("%s: stopping the split's llama-server (pid %s)", why, pid)
        if pid is None:  # no process of its own (a stand-in child): stopped, and reported as dead
            self._spawn(self._end())
            return
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # dying already: its exit is reported as any child's
        except PermissionError:
            self._spawn(self._end())

    async def _end(self) -> None:
        await self.stop(0.0)
        self._on_exit(self)

    def _spawn(self, step: object) -> None:
        assert asyncio.iscoroutine(step)
        task: asyncio.Task[None] = asyncio.ensure_future(step)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
