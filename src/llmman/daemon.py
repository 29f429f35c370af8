"""Composition root: settings -> store, scheduler, gateway -> HTTP server; signals and drain.

``serve`` runs until SIGTERM or SIGINT. Then uvicorn stops accepting connections and lets
in-flight requests finish for up to ``server.shutdown_grace`` seconds. An answer still running then
is cut (llmman.gateway.Gateway.cut_all): a stream ends with its dialect's in-band error frame, an
answer not started yet gets a 503 in its dialect, and :data:`_CUT_MARGIN` seconds later uvicorn
closes whatever is left. Then every llama-server child is stopped (SIGTERM, grace, SIGKILL of its
process group), so no child outlives the daemon.

Under systemd (``NOTIFY_SOCKET`` set, ``Type=notify``) the daemon says ``READY=1`` once uvicorn listens,
``STOPPING=1`` as the shutdown begins, and with ``WatchdogSec=`` pings ``WATCHDOG=1`` while ``GET /health``'s
own check passes (:class:`_Systemd`, llmman.sdnotify). Without ``NOTIFY_SOCKET`` none of it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
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
from llmman.cluster.split_runner import SplitRunner, child_spec
from llmman.config.model_dirs import ModelDirs
from llmman.config.presets import device_env
from llmman.config.settings import Settings
from llmman.config.table import HostAddress, check_keys
from llmman.errors import ConfigError, LlmmanError, RunnerError
from llmman.gateway import Gateway
from llmman.obs.observer import Observer
from llmman.registry.client import RegistryOptions
from llmman.registry.credentials import CredentialStore
from llmman.registry.puller import Puller
from llmman.runner.argv import LaunchSpec, child_env
from llmman.runner.binary import find_llama_server, find_rpc_server
from llmman.runner.logfiles import BACKUPS, DAEMON_LOG, MAX_BYTES, child_log_name
from llmman.runner.process import LlamaServerProcess
from llmman.runner.rpc_worker import CACHE_DIR
from llmman.sched.devices import child_devices
from llmman.sched.gpu import node_memory
from llmman.sched.lending import Lending, LendingOptions
from llmman.sched.scheduler import Launcher, ModelPlan, Runner, Scheduler
from llmman.sdnotify import Notifier, Watchdog, watchdog_interval
from llmman.sizes import format_bytes
from llmman.store import Store
from llmman.tls import check_server_tls, client_context

log = logging.getLogger("llmman")

_CUT_MARGIN = 2  # seconds after the shutdown grace for cut answers to send their error frame
_CHILD_STOP_GRACE = 10.0  # seconds a llama-server child gets after SIGTERM before SIGKILL (Scheduler)
_STOP_SLACK = 10  # seconds on top of the shutdown's own budget told to systemd (EXTEND_TIMEOUT_USEC)
_SYSTEMD_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")  # the daemon's, not a child's


class _Server(uvicorn.Server):
    """uvicorn's server, except that a signal is not re-raised after the HTTP side stops: the
    daemon still has to stop its llama-server children (uvicorn would otherwise kill the
    process with the signal's default action before that cleanup runs). ``on_grace`` is called
    ``grace`` seconds into the shutdown (its drain), before uvicorn's own timeout cancels what is left.
    """

    def __init__(self, config: uvicorn.Config, *, grace: float = 0.0,
                 on_grace: Callable[[], None] | None = None,
                 on_shutdown: Callable[[], None] | None = None,
                 on_started: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._grace = grace
        self._on_grace = on_grace
        self._on_shutdown = on_shutdown  # called as the shutdown begins (then GET /health answers 503)
        self._on_started = on_started  # called once the sockets listen (systemd's READY=1)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._on_started is not None:
            self._on_started()

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


class _Systemd:
    """The daemon's side of systemd's protocol (llmman.sdnotify): ``READY=1`` and ``STATUS=`` once uvicorn
    listens (:meth:`started`), ``STOPPING=1`` and the time the shutdown may take as it begins
    (:meth:`stopping`), and between them the :class:`Watchdog` when ``WATCHDOG_USEC`` asks for one (and
    ``WATCHDOG_PID``, if set, is this process), pinging while ``problem()`` finds none. Every call is a no-op
    without ``NOTIFY_SOCKET``."""

    def __init__(self, settings: Settings, problem: Callable[[], str | None]) -> None:
        env = settings.environment
        self._notifier = Notifier(env.notify_socket)
        self._serving = f"serving on {settings.host.client_url()}"
        interval = watchdog_interval(env.watchdog_usec, env.watchdog_pid, os.getpid())
        if interval is not None and self._notifier.enabled and interval * 2_000_000 > env.watchdog_usec:
            log.warning("systemd's watchdog (WatchdogSec=, WATCHDOG_USEC=%d) is shorter than llmman pings "
                        "(every %gs): systemd will keep restarting it; raise WatchdogSec=",
                        env.watchdog_usec, interval)
        self._watchdog = None if interval is None else Watchdog(self._notifier, interval, problem,
                                                                serving=self._serving)
        # the shutdown's budget: the grace and its cut margin, then the children's stop (SIGTERM, grace)
        self._stop_usec = (_graceful_timeout(settings.shutdown_grace) + int(_CHILD_STOP_GRACE)
                           + _STOP_SLACK) * 1_000_000

    def started(self) -> None:
        """uvicorn listens: ``READY=1``, and the watchdog's pings begin."""
        self._notifier.notify(READY="1", STATUS=self._serving)
        if self._watchdog is not None:
            self._watchdog.start()  # a no-op without NOTIFY_SOCKET

    def stopping(self) -> None:
        """The shutdown began: the pings end and systemd hears ``STOPPING=1`` with ``EXTEND_TIMEOUT_USEC``
        (the shutdown grace, the cut margin and the children's stop), so a grace raised in the config is
        not cut short by the unit's ``TimeoutStopSec=``."""
        if self._watchdog is not None:
            self._watchdog.stop()
        self._notifier.notify(STOPPING="1", STATUS="shutting down: finishing answers, stopping llama-server",
                              EXTEND_TIMEOUT_USEC=str(self._stop_usec))

    async def close(self) -> None:
        """Wait for the watchdog's task to end."""
        if self._watchdog is not None:
            await self._watchdog.close()


def health_problem(obs: Observer, store: Store, scheduler: Scheduler) -> str | None:
    """What ``GET /health`` would answer 503 for (llmman.obs.health.Health.check), or None when it answers
    200: the watchdog's test of real health is the route's own."""
    status, body = obs.health.check(store, draining=scheduler.draining)
    if status == 200:
        return None
    return ": ".join(str(body[key]) for key in ("status", "error") if body.get(key))


def child_environ(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` without systemd's notification variables: they are the daemon's (``NotifyAccess=main``),
    as ``sd_notify(3)``'s ``unset_environment`` keeps them from children."""
    return {key: value for key, value in environ.items() if key not in _SYSTEMD_VARIABLES}


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
        split, wrapper = plan.split, None
        if split is not None:  # a split child (llmman.cluster.split): its workers are leased already
            if split.workers is None or split.workers.spent:
                raise RunnerError(f"the RPC workers of {plan.reference}'s split are gone; it is planned "
                                  "again on the next request")
            spec = child_spec(spec, plan)  # --rpc, -ngl, -ts over the workers (and this node's GPUs)
            wrapper = SplitRunner(split.workers, on_exit)
        process = LlamaServerProcess(
            binary,
            spec,
            # a preset's devices in every *_VISIBLE_DEVICES, else the devices admission placed it on
            env=device_env(env, plan.devices) | child_devices(plan.placement, plan.devices).variables,
            log_path=settings.logs_dir / log_name,
            log_limits=(settings.file_size, settings.file_count),  # log.file_size, log.file_count
            stall_timeout=settings.load_timeout,
            on_exit=on_exit if wrapper is None else wrapper.child_exited,
            health_interval=settings.health_interval,  # the hung-child watchdog (runner.health)
            ring_lines=500,  # enough to hold the buffer-size lines read for the model's real memory
        )
        if wrapper is None:
            await process.start()
            return process
        try:
            await process.start()
        except BaseException:
            await wrapper.leases.release()
            raise
        wrapper.attach(process)
        return wrapper

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


def make_lending(settings: Settings, scheduler: Scheduler, binary: str, environ: dict[str, str]) -> Lending:
    """The workers this node lends to peers (``rpc.*``; llmman.sched.lending): bound to ``rpc.bind``, else
    the host of ``server.host``; ``LLAMA_CACHE=<data_dir>/rpc-cache``; the ``ggml-rpc-server`` next to
    ``binary``, looked for when a peer asks; each with every CPU of the node as its threads."""
    if settings.serve:
        log.warning("rpc.serve is on: peers may start ggml-rpc-server workers here, whose protocol has no "
                    "authentication: keep %s on a network you trust (docs/split.md)",
                    settings.bind or settings.host.bind_host)
    options = LendingOptions(serve=settings.serve, lease=settings.lease,
                             bind=settings.bind or settings.host.bind_host, cache=settings.cache,
                             cache_dir=settings.data_dir / CACHE_DIR, logs_dir=settings.logs_dir,
                             threads=os.cpu_count() or 1,
                             log_limits=(settings.file_size, settings.file_count), ports=settings.rpc_ports)
    return Lending(scheduler, options, find_binary=lambda: find_rpc_server(binary), environ=environ)


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
        obs.launcher(make_launcher(settings, binary, child_environ(dict(os.environ)))),
        default_keep_alive=settings.keep_alive,
        stop_grace=_CHILD_STOP_GRACE,
        capacity=node.capacity,
        node_memory=node,  # per-device admission on a GPU node (sched/devices.py)
        max_loaded=settings.max_loaded_models,
        max_queue=settings.max_queue,
        heal_base=settings.restart_backoff,
    )
    obs.watch(scheduler)
    lending = make_lending(settings, scheduler, binary, child_environ(dict(os.environ)))
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
    gateway.peers = peers  # a model that fits no node is split over the peers lending workers (docs/split.md)
    app = build_app(Services(settings=settings, store=store, scheduler=scheduler, gateway=gateway,
                             puller=puller, peers=peers, obs=obs.start(), lending=lending))
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

    systemd = _Systemd(settings, lambda: health_problem(obs, store, scheduler))

    def shutdown_begins() -> None:
        obs.health.stop()
        systemd.stopping()

    server = _Server(config, grace=_graceful_timeout(settings.shutdown_grace) - _CUT_MARGIN,
                     on_grace=cut_answers, on_shutdown=shutdown_begins, on_started=systemd.started)
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
        await systemd.close()
        for task in preload_tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await lending.close()  # every ggml-rpc-server lent to a peer
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
    if settings.environment.notify_socket and settings.environment.watchdog_usec:
        # systemd's watchdog kills with SIGABRT: every thread's Python stack goes to stderr (the journal)
        # first, so a wedged loop shows where it was stuck
        faulthandler.enable(all_threads=True)
    try:
        import uvloop

        return uvloop.run(run_server(settings, preload))
    except ImportError:
        return asyncio.run(run_server(settings, preload))
