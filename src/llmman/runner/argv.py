"""Pure construction of a llama-server command line and child environment.

Nothing here does I/O: :func:`build_argv` turns a :class:`LaunchSpec` into argv, :func:`child_env`
turns the daemon's environment into the child's. Both are table-tested. Flag meanings are those of the
llama.cpp tree b11434 (``common/arg.cpp``, ``llama-server --help``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llmman.errors import BadRequest

# Variables that would change a child behind our back: ``LLAMA_ARG_*`` and ``LLAMA_API_KEY`` set flags
# (common/arg.cpp); the two ``LLAMA_SERVER_*`` ones switch llama-server into its router-child mode.
_SCRUBBED_PREFIXES = ("LLAMA_ARG_",)
_SCRUBBED_NAMES = frozenset({"LLAMA_API_KEY", "LLAMA_SERVER_ROUTER_PORT", "LLAMA_SERVER_CHILD_MODE"})

KEEP_LOCAL = r"^(token_embd|output)\.weight$=CPU"
"""The ``--override-tensor`` of a split child (:attr:`LaunchSpec.rpc`): the input embedding and the output
head stay on this node's CPU. A model with tied embeddings loads its output head as a second
``token_embd.weight``, which llama.cpp would otherwise put on the last RPC device with the output layer
(measured with Gemma 3 270M: 193 MiB of its 235 sent to the last worker; 25 MiB with this)."""


@dataclass(frozen=True)
class LaunchSpec:
    """What one llama-server child should load and how.

    Attributes:
        model_path: the GGUF file (first shard of a split model), passed as ``-m``.
        alias: the model id the child reports (``-a``); llmman uses the canonical model reference.
        n_ctx: context per slot, in tokens (Ollama's ``num_ctx``); the child gets ``n_ctx * n_parallel``.
        n_parallel: number of slots (``-np``), i.e. requests decoded at once; each is guaranteed ``n_ctx``.
        mmproj: multimodal projector file (``--mmproj``), or None.
        n_gpu_layers: ``-ngl`` (-1 = auto, -2 = all, N = last N layers), or None for llama-server's default.
        embedding: start with ``--embeddings`` (llama-server then still answers chat routes too).
        threads: ``-t`` CPU threads, or None for llama-server's default (physical cores).
        split_mode: ``-sm`` (``none``: the whole model on the one device ``main_gpu``), or None.
        main_gpu: ``-mg``, the index among the child's visible devices, or None.
        tensor_split: ``-ts``, the fraction of the model on each visible device in order, or () for
            llama-server's default (in proportion to each device's free memory).
        rpc: ``ggml-rpc-server`` workers (``host:port``) for a split model (``--rpc``,
            llmman.cluster.split): ``n_gpu_layers`` and ``tensor_split`` say what goes to them.
        keep_local: with ``rpc``, pin the output head to this node's CPU (:data:`KEEP_LOCAL`): for a
            split whose share runs on this node's CPU, where the output layer would otherwise go to the
            last worker. False when its share runs on this node's GPUs, which then hold the output layer
            (llama.cpp keeps the input embedding on the CPU anyway).
        extra_args: appended verbatim after everything else (later flags win in llama-server).

    Raises:
        BadRequest: ``n_ctx`` or ``n_parallel`` below 1, or an empty alias.
    """

    model_path: Path
    alias: str
    n_ctx: int
    n_parallel: int = 1
    mmproj: Path | None = None
    n_gpu_layers: int | None = None
    embedding: bool = False
    threads: int | None = None
    split_mode: str | None = None
    main_gpu: int | None = None
    tensor_split: tuple[float, ...] = ()
    rpc: tuple[str, ...] = ()
    keep_local: bool = True
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.n_ctx < 1:
            raise BadRequest(f"context length must be at least 1 token, got {self.n_ctx}")
        if self.n_parallel < 1:
            raise BadRequest(f"parallel slots must be at least 1, got {self.n_parallel}")
        if not self.alias:
            raise BadRequest("a llama-server child needs a non-empty alias")
        if any(part < 0 for part in self.tensor_split) or (self.tensor_split and not any(self.tensor_split)):
            raise BadRequest(f"a tensor split needs parts of at least 0, not all 0, got {self.tensor_split}")


@dataclass(frozen=True)
class LoadOptions:
    """Ollama's load-time ``options`` as llama-server flags (:func:`load_args`); None = not asked, the
    child's default (or a preset's). ``num_ctx`` is :attr:`LaunchSpec.n_ctx` and ``num_gpu``
    :attr:`LaunchSpec.n_gpu_layers`, not here.

    Attributes:
        threads: ``num_thread`` -> ``-t N``.
        batch: ``num_batch`` -> ``-b N -ub N``: Ollama's runner uses one batch size for both llama.cpp's
            logical and physical batch.
        main_gpu: ``main_gpu`` -> ``-mg K`` (K among the devices the child sees).
        mmap: ``use_mmap`` and mlock: ``use_mlock`` -> ``-lm MODE`` (llama-server b11434 has no
            ``--no-mmap``/``--mlock``: its ``--load-mode`` is ``none``, ``mmap``, ``mlock`` or
            ``mmap+mlock``; see :func:`load_mode`).
    """

    threads: int | None = None
    batch: int | None = None
    main_gpu: int | None = None
    mmap: bool | None = None
    mlock: bool | None = None


def load_mode(mmap: bool | None, mlock: bool | None) -> str | None:
    """llama-server's ``--load-mode`` for Ollama's ``use_mmap``/``use_mlock`` (None: neither asked, the
    default ``auto``). mmap true -> ``mmap``, false -> ``none``; mlock true adds ``mlock`` (``mmap+mlock``
    unless mmap is false); mlock false alone asks nothing."""
    if mmap is None and not mlock:
        return None
    if mlock:
        return "mlock" if mmap is False else "mmap+mlock"
    return "mmap" if mmap else "none"


def load_args(load: LoadOptions, *, embedding: bool = False, n_ctx: int = 0,
              cpu_only: bool = False) -> tuple[str, ...]:
    """The flags for ``load`` (appended to a child's argv): ``[-t N] [-b N -ub N] [-mg K] [-lm MODE]
    [-dev none]``.

    ``cpu_only`` (``-ngl 0``: Ollama's ``num_gpu`` 0) adds ``-dev none``: with no layer on a GPU llama-server
    would still put compute buffers there (it offloads big batches' matrix products), and llmman plans no
    device memory for such a model (llmman.sched.plan.ModelPlan.on_host).

    An embedding child (``embedding``) already gets ``-b``/``-ub`` equal to its per-slot context
    ``n_ctx`` (every input must fit in one physical batch, see :func:`build_argv`): its batch is
    ``num_batch`` only when that is larger, never smaller than an input it must take whole.
    """
    args: list[str] = []
    if load.threads is not None:
        args += ["-t", str(load.threads)]
    if load.batch is not None and not (embedding and load.batch <= n_ctx):
        args += ["-b", str(load.batch), "-ub", str(load.batch)]
    if load.main_gpu is not None:
        args += ["-mg", str(load.main_gpu)]
    mode = load_mode(load.mmap, load.mlock)
    if mode is not None:
        args += ["-lm", mode]
    if cpu_only:
        args += ["-dev", "none"]
    return tuple(args)


def build_argv(binary: str, spec: LaunchSpec, *, host: str, port: int) -> list[str]:
    """Return the full argv (binary first) that starts ``spec`` listening on ``host:port``.

    Shape: ``<binary> -m PATH --host H --port P -c (n_ctx*n_parallel) -np N --no-kv-unified -a ALIAS
    --no-ui --metrics --log-verbosity 4 [--mmproj F] [-ngl N] [--embeddings -b n_ctx -ub n_ctx] [-t N]
    [-sm MODE] [-mg K] [-ts F0,F1,..] [--rpc A,B [-ot KEEP_LOCAL]] *extra_args``.

    Rules, from llama-server b11434: ``-c`` is the total KV size shared by all slots, and an explicit
    ``-np`` with ``--no-kv-unified`` gives each slot a fixed ``c / np``, so ``n_ctx * n_parallel`` guarantees
    every slot ``n_ctx`` tokens (Ollama's ``num_ctx`` x parallel). Passing ``-c`` also stops ``--fit``
    from shrinking the context. ``--metrics`` enables ``/metrics``; ``--no-ui`` skips the web UI.
    ``--log-verbosity 4`` makes it print its ``... buffer size = N MiB`` lines, which llmman reads for the
    memory a model really takes (memory.parse_buffers). An embedding child gets ``-b`` and ``-ub`` equal to
    the per-slot context: with ``--embeddings`` each input must fit in one physical batch (default 512
    tokens, llama-server's ``--ubatch-size``), so this lets every input the slot can hold through.
    ``-sm``/``-mg``/``-ts`` place the model on the devices the child sees (llmman.sched.devices); the
    parts of ``-ts`` are proportions, written with up to 4 significant digits. A request's load options
    (Ollama's ``num_thread``, ``num_batch``, ``main_gpu``, ``use_mmap``, ``use_mlock``) come in
    ``extra_args`` from :func:`load_args`, after a preset's, so the request's win. A split child
    (:attr:`LaunchSpec.rpc`) names its workers with ``--rpc`` (llama.cpp lists them as devices RPC0, RPC1, ...
    before any local GPU, so ``-ts`` is in ``--rpc`` order, then this node's GPUs) and, when its share runs
    on this node's CPU (:attr:`LaunchSpec.keep_local`), keeps its output head here (:data:`KEEP_LOCAL`).
    """
    argv = [
        binary,
        "-m", str(spec.model_path),
        "--host", host,
        "--port", str(port),
        "-c", str(spec.n_ctx * spec.n_parallel),
        "-np", str(spec.n_parallel),
        "--no-kv-unified",
        "-a", spec.alias,
        "--no-ui",
        "--metrics",
        "--log-verbosity", "4",
    ]  # fmt: skip
    if spec.mmproj is not None:
        argv += ["--mmproj", str(spec.mmproj)]
    if spec.n_gpu_layers is not None:
        argv += ["-ngl", str(spec.n_gpu_layers)]
    if spec.embedding:
        argv += ["--embeddings", "-b", str(spec.n_ctx), "-ub", str(spec.n_ctx)]
    if spec.threads is not None:
        argv += ["-t", str(spec.threads)]
    if spec.split_mode is not None:
        argv += ["-sm", spec.split_mode]
    if spec.main_gpu is not None:
        argv += ["-mg", str(spec.main_gpu)]
    if spec.tensor_split:
        argv += ["-ts", ",".join(f"{part:.4g}" for part in spec.tensor_split)]
    if spec.rpc:
        argv += ["--rpc", ",".join(spec.rpc)]
        if spec.keep_local:
            argv += ["-ot", KEEP_LOCAL]
    argv.extend(spec.extra_args)
    return argv


def child_env(parent: Mapping[str, str], *, config_home: Path) -> dict[str, str]:
    """Return the environment for a llama-server child, derived from the daemon's ``parent`` environment.

    Removes every ``LLAMA_ARG_*`` (llama-server reads each flag from one, below the CLI but above
    defaults), ``LLAMA_API_KEY`` (would lock llmman out of its own child), and ``LLAMA_SERVER_ROUTER_PORT``
    / ``LLAMA_SERVER_CHILD_MODE`` (they turn the child into a router child that exits on stdin EOF).
    Sets ``XDG_CONFIG_HOME`` to ``config_home``, an empty directory, so a user's
    ``~/.config/llama.cpp/config.ini`` cannot change children. Sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    unless the parent sets it, so that CUDA numbers the GPUs as NVML (and ``nvidia-smi``) do: llmman's
    device indexes come from NVML (llmman.sched.gpu), CUDA's default order is fastest first.
    Everything else (``PATH``, ``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``, ``LD_LIBRARY_PATH``, ...)
    is kept.
    """
    env = {
        name: value
        for name, value in parent.items()
        if name not in _SCRUBBED_NAMES and not name.startswith(_SCRUBBED_PREFIXES)
    }
    env["XDG_CONFIG_HOME"] = str(config_home)
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return env
