"""What the scheduler is asked to run: a model's plan, the child it gets, and the launcher contract.

:class:`ModelPlan` is resolved from the store by the gateway; :data:`Launcher` starts a child for it
(runner.process.LlamaServerProcess in the daemon, fakes in tests); :class:`Runner` is all the
scheduler and the gateway read of that child.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from llmman.runner.argv import LoadOptions
from llmman.runner.crash import Cause
from llmman.sched.devices import Placement

MAX_KEEP_ALIVE = 292 * 365.25 * 86400.0
"""Seconds; a longer keep_alive means forever (Go's largest duration, where Ollama's ends too)."""


class Runner(Protocol):
    """What the scheduler and the gateway need of a started llama-server child
    (runner.process.LlamaServerProcess; the fakes in tests implement all of it too)."""

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` of the child."""
        ...

    @property
    def pid(self) -> int | None:
        """The child's process id (``/api/ps``), None when there is no process."""
        ...

    @property
    def exited(self) -> asyncio.Event:
        """Set once the child has exited and been reaped (the gateway waits on it before a retry)."""
        ...

    @property
    def exit_cause(self) -> Cause | None:
        """Why the child died on its own (runner.crash), else None."""
        ...

    @property
    def exit_detail(self) -> str | None:
        """A fuller cause where one is known (``hung (no /health answer for 31 s)``), else None."""
        ...

    @property
    def log_lines(self) -> list[str]:
        """The recent output lines it keeps, oldest first (read for llama-server's buffer sizes)."""
        ...

    def log_tail(self, n: int = 20) -> list[str]:
        """The last ``n`` output lines, oldest first (quoted in a crash's failure message)."""
        ...

    async def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, up to ``grace`` seconds, then SIGKILL; idempotent; ``on_exit`` is not called."""
        ...


class WorkerLeases(Protocol):
    """The ``ggml-rpc-server`` workers a split child runs on, leased from peers
    (llmman.cluster.lenders.Leases): the child's wrapper (llmman.cluster.split_runner.SplitRunner) watches
    them while the child runs and releases them when it stops."""

    @property
    def spent(self) -> bool:
        """True once released or lost: a child must never be started on them again."""
        ...

    def watch(self, lost: Callable[[str], None]) -> None:
        """``lost(why)`` once a worker is gone (its lender answered a renewal with 404, or did not answer
        for a whole lease); at once if one is already. The leases are renewed until :meth:`release`."""
        ...

    async def release(self) -> None:
        """Stop every worker (``DELETE`` on its lender) and the renewals. Idempotent."""
        ...


@dataclass(frozen=True)
class Split:
    """A model split over this node and RPC workers on peers (llmman.cluster.split.plan_split).

    Attributes:
        endpoints: the workers' ``host:port`` in ``--rpc`` order (RPC0 first).
        n_gpu_layers: ``-ngl`` (the workers' layers plus the output slot; on this node's GPUs every layer).
        tensor_split: ``--tensor-split`` proportions, one per worker.
        parts: ``(node, bytes)`` of every share, this node first (``/api/ps``'s ``split``).
        workers: the leases on the workers (not part of the plan's identity).
        local_slots: this node's offloaded layers, after the workers' (its layers and the output layer),
            divided over its GPUs at launch (llmman.cluster.split.device_split); 0 when its share runs on
            its CPU.
    """

    endpoints: tuple[str, ...]
    n_gpu_layers: int
    tensor_split: tuple[int, ...]
    parts: tuple[tuple[str, int], ...]
    workers: WorkerLeases | None = field(default=None, compare=False, repr=False)
    local_slots: int = 0


class ChildKey(NamedTuple):
    """What makes two plans one child (:attr:`ModelPlan.child`): the GGUF file and the child options (a split
    child's workers too: a split plan is its own child)."""

    model_path: str
    mmproj_path: str | None
    embedding: bool
    pooling: str | None
    n_parallel: int
    n_gpu_layers: int | None
    devices: str | None
    extra_args: tuple[str, ...]
    rpc: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelPlan:
    """Everything needed to start one model, resolved from the store by the caller.

    Attributes:
        reference: canonical full reference, e.g. ``docker.io/ai/smollm2:135m`` (the table key).
        digest: manifest digest ``sha256:<hex>``.
        size: bytes of weights (sum of the manifest's layers).
        n_ctx: context per slot in tokens, already clamped to the model's trained context.
        model_path: the file for llama-server's ``-m`` (first shard of a split GGUF).
        mmproj_path: the multimodal projector for ``--mmproj``, or None.
        estimate: predicted memory in bytes (llmman.sched.memory.estimate), 0 = unknown (admitted freely).
        n_parallel: slots (``-np``); requests beyond them wait inside llama-server and count as queued.
        embedding: start the child with ``--embeddings`` (its own child, beside a chat child of the model).
        pooling: ``--pooling`` for an embedding child (``mean`` for chat models whose GGUF has none), or None.
        n_gpu_layers: ``-ngl`` from the model's preset (llmman.config.presets), or None.
        devices: GPU ids for the child's ``*_VISIBLE_DEVICES`` from its preset, or None; they pin it: it is
            admitted against those devices only (llmman.sched.devices).
        extra_args: the preset's ``extra_args``, then the request's load options as flags
            (llmman.runner.argv.load_args), appended to argv.
        load: the load options the request asked for (Ollama's ``num_thread``, ``num_batch``,
            ``main_gpu``, ``use_mmap``, ``use_mlock``; None = not asked), read by :func:`reloads`.
        asked_gpu_layers: the request's ``num_gpu`` (``-ngl``; it overrides the preset's in
            :attr:`n_gpu_layers`), or None when it asked none.
        placement: the devices admission placed it on (llmman.sched.devices.place, set at admission), or
            None on a host-only or unknown node; not part of :attr:`child` (where it runs, not what).
        split: the RPC workers and flags of a model split over the pool (llmman.cluster.split), or None;
            :attr:`estimate` is then this node's share only.
    """

    reference: str
    digest: str
    size: int
    n_ctx: int
    model_path: str = ""
    mmproj_path: str | None = None
    estimate: int = 0
    n_parallel: int = 1
    embedding: bool = False
    pooling: str | None = None
    n_gpu_layers: int | None = None
    devices: str | None = None
    extra_args: tuple[str, ...] = ()
    placement: Placement | None = None
    load: LoadOptions = field(default_factory=LoadOptions)
    asked_gpu_layers: int | None = None
    split: Split | None = None

    @property
    def on_host(self) -> bool:
        """True when no layer goes to a GPU (``num_gpu`` 0, ``-ngl 0``): it takes no device memory."""
        return self.n_gpu_layers == 0

    @property
    def key(self) -> str:
        """The scheduler's table key: the reference, plus ``#embedding`` for an embedding child."""
        return self.reference + "#embedding" if self.embedding else self.reference

    @property
    def child(self) -> ChildKey | None:
        """What makes two plans one child: the same GGUF file and the same child options (not the
        context: a loaded context at least as large is reused, see Scheduler.acquire). Store paths are
        content-addressed blobs, so a copy (``llmman cp``) or a second tag of a model shares its child,
        as Ollama keys its runners by model path. None when the file is unknown (never shared)."""
        if not self.model_path:
            return None
        return ChildKey(self.model_path, self.mmproj_path, self.embedding, self.pooling, self.n_parallel,
                        self.n_gpu_layers, self.devices, self.extra_args,
                        self.split.endpoints if self.split is not None else ())


def reloads(loaded: ModelPlan, wanted: ModelPlan) -> bool:
    """True when ``wanted`` asks for a load option that ``loaded``'s child runs otherwise, so the child must
    be reloaded (Ollama's ``needsReload``, server/sched.go: the runner options differ). An option the
    request does not give is whatever the loaded child runs (as a request without ``num_ctx`` is served
    by a loaded larger context), so requests without load options never reload a model."""
    if wanted.asked_gpu_layers is not None and wanted.asked_gpu_layers != loaded.n_gpu_layers:
        return True
    have, asked = loaded.load, wanted.load
    return any(value is not None and value != getattr(have, name)
               for name, value in vars(asked).items())


def outgrown(loaded: ModelPlan, wanted: ModelPlan) -> bool:
    """True when ``wanted`` needs another child than ``loaded``'s once nobody uses it: a larger context (a
    loaded context at least as large serves it, as Scheduler.acquire reuses one) or other load options
    (:func:`reloads`). The scheduler reloads an idle child it finds so; a split child is planned again
    instead (llmman.gateway), since its workers are sized for its context."""
    return wanted.n_ctx > loaded.n_ctx or reloads(loaded, wanted)


Launcher = Callable[[ModelPlan, Callable[[Runner], None]], Awaitable[Runner]]
"""Starts a child for a plan and returns it once ready; the second argument is the on-exit
callback the child must call if it dies on its own. Raises RunnerError on failure."""
