"""The daemon's ASGI app in this process, with a real scheduler whose children are the fake llama-server.

:class:`InProcessApp` builds ``build_app(Services)`` exactly as ``daemon.run_server`` does (same
launcher, gateway and aiohttp session), runs it on a private event loop in a thread, and lets
synchronous tests (hypothesis included) call it through ``httpx.ASGITransport``. No port is bound
for llmman itself; the fake children listen on loopback.

:func:`make_store` writes tiny synthetic GGUFs (``tests/unit/ggufgen.py``) into a fresh store.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.unit.ggufgen import write_gguf

from llmman.api.app import build_app
from llmman.api.services import Services
from llmman.config.settings import Settings, load_settings
from llmman.daemon import make_launcher
from llmman.gateway import Gateway
from llmman.refs import parse_reference
from llmman.sched.scheduler import Scheduler
from llmman.store import Store

T = TypeVar("T")


def make_store(root: Path, names: Sequence[str] = ("tiny",)) -> Store:
    """A store at ``root / "store"`` holding one tiny synthetic GGUF model per name."""
    store = Store(root / "store")
    for name in names:
        gguf = write_gguf(root / "gguf" / f"{name.replace(':', '_')}.gguf", name=f"Tiny {name}")
        store.build(parse_reference(name), gguf)
    return store


def fake_env(root: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """An isolated environment for settings and children: the fake as llama-server, no user config."""
    bindir = root / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    binary = make_fake_binary(bindir)
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMAN_", "OLLAMA_", "FAKE_"))}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        LLMMAN_MODELS=str(root / "store"),
        LLMMAN_LLAMA_SERVER=str(binary),
        LLMMAN_HOST="127.0.0.1:1",
    )
    env.update(extra or {})
    return env


class InProcessApp:
    """``build_app`` over a real store, scheduler and gateway, served from a private event loop.

    Use as a context manager; :meth:`request` is synchronous and thread-safe.
    """

    def __init__(self, root: Path, *, env: Mapping[str, str] | None = None,
                 names: Sequence[str] = ("tiny",)) -> None:  # fmt: skip
        self.root = root
        self.store = make_store(root, names)
        self.env = fake_env(root, env)
        self.settings: Settings = load_settings(
            env=self.env, system_file=root / "no-system.conf", user_file=root / "no-user.conf"
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="inprocess-app", daemon=True)
        self.scheduler: Scheduler
        self.services: Services
        self._client: httpx.AsyncClient
        self._session: aiohttp.ClientSession

    def __enter__(self) -> InProcessApp:
        self._thread.start()
        try:
            self.call(self._setup())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self._teardown(), timeout=60)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __del__(self) -> None:  # an app never entered still owns its loop
        if not self._loop.is_closed() and not self._thread.is_alive():
            self._loop.close()

    async def _setup(self) -> None:
        settings = self.settings
        self.scheduler = Scheduler(
            make_launcher(settings, settings.llama_server, dict(self.env)),
            default_keep_alive=settings.keep_alive,
            stop_grace=5.0,
        )
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False
        )
        gateway = Gateway(self.store, self.scheduler, self._session,
                          context_length=settings.context_length, aliases=settings.aliases)  # fmt: skip
        self.services = Services(settings=settings, store=self.store, scheduler=self.scheduler,
                                 gateway=gateway)  # fmt: skip
        transport = httpx.ASGITransport(app=build_app(self.services), raise_app_exceptions=False)
        self._client = httpx.AsyncClient(transport=transport, base_url="http://llmman.localhost", timeout=60)

    async def _teardown(self) -> None:
        await self._client.aclose()
        await self.scheduler.close()
        await self._session.close()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the app's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request to the app (the whole body is read)."""
        return self.call(self._client.request(method, path, **kwargs))

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def ps(self) -> list[dict[str, Any]]:
        models = self.request("GET", "/api/ps").json()["models"]
        assert isinstance(models, list)
        return models

    def loaded_pids(self) -> list[int]:
        """Pids of the children the scheduler holds now."""
        return [s.pid for s in self.scheduler.snapshot() if s.pid is not None]

