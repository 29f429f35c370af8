"""Composition root: settings -> store, scheduler, gateway -> HTTP server; signals and drain.

``serve`` runs until SIGTERM or SIGINT. Then uvicorn stops accepting connections and lets
in-flight requests finish for up to ``server.shutdown_grace`` seconds. An answer still running then
is cut (llmman.gateway.Gateway.cut_all): a stream ends with its dialect's in-band error frame, an
answer not started yet gets a 503 in its dialect, and :data:`_CUT_MARGIN` seconds later uvicorn
closes whatever is left. Then every llama-server child is stopped (SIGTERM, grace, SIGKILL of its
process group), so no child outlives the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.handlers
import math
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import uvicorn

from llmman.api.app import build_app
from llmman.api.limits import header_timeout_protocol
from llmman.api.services import Services
from llmman.cluster.discovery import Discovery, DnsLookup, ServerNames
from llmman.cluster.peers import Peers, parse_entries
from llmman.cluster.source import NODE_ID
from llmman.config.model_dirs import ModelDirs
from llmman.config.presets import device_env
from llmman.config.settings import Settings
from llmman.config.table import HostAddress, check_keys
from llmman.errors import ConfigError, LlmmanError
from llmman.gateway import Gateway
from llmman.obs.observer import Observer
from llmman.registry.client import RegistryOptions
from llmman.registry.credentials import CredentialStore
from llmman.registry.puller import Puller
from llmman.runner.argv import LaunchSpec, child_env
from llmman.runner.binary import find_llama_server
from llmman.runner.logfiles import BACKUPS, DAEMON_LOG, MAX_BYTES, child_log_name
from llmman.runner.process import LlamaServerProcess
from llmman.sched.devices import child_devices
from llmman.sched.gpu import node_memory
from llmman.sched.scheduler import Launcher, ModelPlan, Runner, Scheduler
from llmman.sizes import format_bytes
from llmman.store import Store
from llmman.tls import check_server_tls, client_context

log = logging.getLogger("llmman")

_CUT_MARGIN = 2  # seconds after the shutdown grace for cut answers to send their error frame


class _Server(uvicorn.Server):
    """uvicorn's server, except that a signal is not re-raised after the HTTP side stops: the
    daemon still has to stop its llama-server children (uvicorn would otherwise kill the
    process with the signal's default action before that cleanup runs). ``on_grace`` is called
    ``grace`` seconds into the shutdown (its drain), before uvicorn's own timeout cancels what is left.
    """

    def __init__(self, config: uvicorn.Config, *, grace: float = 0.0,
                 on_grace: Callable[[], None] | None = None,
                 on_shutdown: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._grace = grace
        self._on_grace = on_grace
        self._on_shutdown = on_shutdown  # called as the shutdown begins (then GET /health answers 503)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._on_shutdown is not None:
            self._on_shutdown()
        timer = None
        if self._on_grace is not None:
            timer = asyncio.get_running_loop().call_later(self._grace, self._on_grace)
        try:
            await super().shutdown(sockets)
        finally:
            if timer is not None:
                timer.cancel()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.handle_exit)
        yield


def _configure_logging(debug: bool, logs_dir: Path | None = None, *, max_bytes: int = MAX_BYTES,
                       backups: int = BACKUPS) -> None:
    """The daemon's log on stderr and, with ``logs_dir``, in ``<logs_dir>/llmman.log`` too, rotated past
    ``max_bytes`` keeping ``backups`` old files like the children's logs (``log.file_size``,
    ``log.file_count``; llmman.runner.logfiles; ``llmman logs`` reads it). A logs directory that cannot
    be written leaves stderr only, said once."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[llmman] %(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger("llmman")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False
    if logs_dir is not None:
        try:
            logs_dir.mkdir(parents=True, exist_ok=True)
            to_file = logging.handlers.RotatingFileHandler(logs_dir / DAEMON_LOG, maxBytes=max_bytes,
                                                           backupCount=backups, encoding="utf-8")
        except OSError as exc:
            log.warning("cannot write the daemon log in %s (%s): logging to stderr only",
                        logs_dir, exc.strerror or exc)
            return
        to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S"))
        root.addHandler(to_file)


def launch_spec(plan: ModelPlan) -> LaunchSpec:
    """The child's :class:`LaunchSpec` for ``plan`` (pure): slots, ``-ngl`` and extra argv come from the
    plan, i.e. from the model's preset (llmman.config.presets) where it has one."""
    pooling = ("--pooling", plan.pooling) if plan.pooling else ()
    devices = child_devices(plan.placement, plan.devices)  # where admission placed it (sched/devices.py)
    return LaunchSpec(
        model_path=Path(plan.model_path),
        alias=plan.reference,
        n_ctx=plan.n_ctx,
        n_parallel=plan.n_parallel,
        mmproj=Path(plan.mmproj_path) if plan.mmproj_path else None,
        n_gpu_layers=plan.n_gpu_layers,
        embedding=plan.embedding,
        split_mode=devices.split_mode,
        main_gpu=devices.main_gpu,
        tensor_split=devices.tensor_split,
        extra_args=pooling + plan.extra_args,
    )


def make_launcher(settings: Settings, binary: str, environ: dict[str, str]) -> Launcher:
    """A launcher that starts one ``llama-server`` per plan with the settings' slots and timeouts.

    Children get ``environ`` scrubbed of ``LLAMA_ARG_*`` (runner.argv.child_env), an empty
    ``XDG_CONFIG_HOME``, and a log file ``<logs_dir>/<reference>.log``.
    """
    config_home = settings.data_dir / "llama-config"
    try:
        config_home.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only data dir: any empty folder will do
        config_home = Path(tempfile.mkdtemp(prefix="llmman-llama-config-"))
    env = child_env(environ, config_home=config_home)

    async def launch(plan: ModelPlan, on_exit: Callable[[Runner], None]) -> Runner:
        spec = launch_spec(plan)
        log_name = child_log_name(plan.key)
        process = LlamaServerProcess(
            binary,
            spec,
            # a preset's devices in every *_VISIBLE_DEVICES, else the devices admission placed it on
            env=device_env(env, plan.devices) | child_devices(plan.placement, plan.devices).variables,
            log_path=settings.logs_dir / log_name,
            log_limits=(settings.file_size, settings.file_count),  # log.file_size, log.file_count
            stall_timeout=settings.load_timeout,
            on_exit=on_exit,
            health_interval=settings.health_interval,  # the hung-child watchdog (runner.health)
            ring_lines=500,  # enough to hold the buffer-size lines read for the model's real memory
        )
        await process.start()
        return process

    return launch


def make_peers(settings: Settings) -> Peers:
    """The aggregation's peers (``aggregation.peers``) with their own HTTP session and the peer key
    (``aggregation.api_key``, else the first of ``auth.api_keys``); ``https://`` peers are verified against
    the system CAs plus ``tls.ca_file``. Entries naming DNS names are followed from ``Peers.start``
    (``aggregation.dns_server``, else the system's resolver; llmman.cluster.discovery), an ``https://`` one
    verified as its name."""
    entries = parse_entries(settings.peer_list, settings.host)
    static = tuple(e for e in entries if isinstance(e, HostAddress))
    key = settings.api_key or next(iter(settings.api_key_list), "")
    names = ServerNames()
    discovery = None
    if len(static) < len(entries):
        discovery = Discovery(entries, DnsLookup(settings.dns_server), own=settings.host, names=names)
    connector = aiohttp.TCPConnector(limit=0, ssl=client_context(settings.ca_file))
    session = aiohttp.ClientSession(connector=connector, auto_decompress=False, middlewares=(names,))
    if entries:
        log.info("aggregation peers: %s", ", ".join(e.netloc if isinstance(e, HostAddress) else f"{e} (DNS)"
                                                  for e in entries))
    return Peers(session, static, api_key=key, refresh=settings.refresh, discovery=discovery, node_id=NODE_ID)


async def _preload(gateway: Gateway, name: str) -> None:
    """``llmman serve MODEL``: load MODEL now and keep it loaded (keep_alive forever)."""
    try:
        lease = await gateway.acquire(await gateway.ensure(name), keep_alive=math.inf, num_ctx=None)
        lease.release()
        log.info("preloaded %s", name)
    except LlmmanError as exc:
        log.error("preload of %s failed: %s", name, exc.message)


async def run_server(settings: Settings, preload: str | None = None) -> int:
    """Serve until a signal arrives; returns the process exit code."""
    binary = find_llama_server(settings.llama_server, path_env=settings.environment.path)
    store = Store(settings.models)
    node = node_memory(cap=settings.memory, reserve=settings.reserve,
                       environ=settings.environment.visible_devices)
    log.info("memory for models: %s (%s, %d device(s))", format_bytes(node.capacity), node.accelerator,
             len(node.devices))
    obs = Observer.of(settings)  # request log, metrics, health (llmman.obs)
    scheduler = Scheduler(
        obs.launcher(make_launcher(settings, binary, dict(os.environ))),
        default_keep_alive=settings.keep_alive,
        capacity=node.capacity,
        node_memory=node,  # per-device admission on a GPU node (sched/devices.py)
        max_loaded=settings.max_loaded_models,
        max_queue=settings.max_queue,
        heal_base=settings.restart_backoff,
    )
    obs.watch(scheduler)
    peers = make_peers(settings)  # before any other session: a bad peer list fails with nothing to close
    # llama-server closes a connection after each streamed answer while announcing keep-alive, so a
    # pooled connection can be dead when reused: one fresh loopback connection per request instead.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    session = aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        auto_decompress=False,
    )
    gateway = Gateway(store, scheduler, session, context_length=settings.context_length,
                      aliases=settings.aliases, num_parallel=settings.num_parallel, presets=settings.presets)
    puller = Puller(store, CredentialStore.of(settings), offline=settings.offline,
                    options=RegistryOptions.of(settings))  # insecure hosts, tls.ca_file, HF_ENDPOINT
    gateway.puller = puller  # models missing from the store are pulled on first use
    gateway.leased = obs.metrics.waited  # queue wait per model, in /metrics
    app = build_app(Services(settings=settings, store=store, scheduler=scheduler, gateway=gateway,
                             puller=puller, peers=peers, obs=obs.start()))
    config = uvicorn.Config(
        app,
        host=settings.host.bind_host,
        port=settings.host.port,
        loop="none",
        http=header_timeout_protocol(settings.body_timeout),  # httptools, headers bounded in time
        lifespan="off",
        access_log=settings.debug,
        log_level="debug" if settings.debug else "warning",
        timeout_graceful_shutdown=_graceful_timeout(settings.shutdown_grace),
        timeout_keep_alive=30,
        ssl_certfile=settings.cert_file or None,
        ssl_keyfile=settings.key_file or None,
    )
    def cut_answers() -> None:
        count = gateway.cut_all(LlmmanError("llmman is shutting down: the answer was cut at the end of the "
                                            "shutdown grace", status=503, code="shutting_down"))
        if count:
            log.warning("shutdown grace over: cut %d answer(s) still running", count)

    server = _Server(config, grace=_graceful_timeout(settings.shutdown_grace) - _CUT_MARGIN,
                     on_grace=cut_answers, on_shutdown=obs.health.stop)
    log.info("llmman %s using %s, store %s", _version(), binary, settings.models)
    log.info("listening on %s", settings.host.client_url())
    preloads = [preload] if preload else []
    preloads += [ref for ref, preset in settings.presets.items() if preset.preload and ref not in preloads]
    preload_tasks = [asyncio.create_task(_preload(gateway, name)) for name in preloads]
    peers.start()  # the background refresh of the peers' state; peers.close() below stops it
    if settings.scan_dirs:  # store.scan_dirs: imported in the background, the daemon answers meanwhile
        _start_scan(store, settings.scan_dirs, settings.environment.model_dirs)
    try:
        await server.serve()
    finally:
        log.info("shutting down: stopping every llama-server")
        for task in preload_tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await scheduler.close()
        await session.close()
        await peers.close()
        await peers.session.close()
        await asyncio.to_thread(obs.close)
    return 0 if server.started else 1


def _start_scan(store: Store, entries: tuple[str, ...], dirs: ModelDirs) -> None:
    """Import the models of ``store.scan_dirs`` in a daemon thread (llmman.store.imports.scan)."""
    import threading

    from llmman.store.imports.scan import import_scan_dirs

    threading.Thread(target=import_scan_dirs, args=(store, entries, dirs), name="llmman-scan",
                     daemon=True).start()


def _graceful_timeout(grace: float) -> int:
    """uvicorn's ``timeout_graceful_shutdown``: the grace in whole seconds (1 s to a day) plus the
    margin cut answers get to send their error frame."""
    return int(min(max(1.0, grace), 86400.0)) + _CUT_MARGIN


def _version() -> str:
    from llmman import __version__

    return __version__


def serve(settings: Settings, preload: str | None = None) -> int:
    """Run the daemon in the foreground (``llmman serve [MODEL]``). Blocks; returns the exit code.

    Raises:
        LlmmanError: no llama-server binary could be found (before binding).
    """
    _configure_logging(settings.debug, settings.logs_dir, max_bytes=settings.file_size,
                       backups=settings.file_count)
    try:  # load_settings refuses these already; a Settings built by hand must not turn keys off either
        check_keys(settings.api_keys)
    except ValueError as exc:
        raise ConfigError(f"invalid value for auth.api_keys (LLMMAN_API_KEYS): {exc}") from None
    if not settings.host.is_loopback() and not settings.api_key_list and settings.enforce:
        raise LlmmanError(f"refusing to serve on {settings.host} without API keys: set auth.api_keys "
                          "(LLMMAN_API_KEYS), or LLMMAN_AUTH=off on a network you trust")
    check_server_tls(settings.host.scheme, settings.cert_file, settings.key_file)
    try:
        import uvloop

        return uvloop.run(run_server(settings, preload))
    except ImportError:
        return asyncio.run(run_server(settings, preload))
