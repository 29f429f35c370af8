"""The variables llmman honours that are not its own settings: other tools' conventions, read once.

``PATH`` (where ``llama-server`` is searched), ``HF_ENDPOINT`` and ``HF_TOKEN_PATH``/``HF_HOME``
(Hugging Face's endpoint and token file, as ``huggingface_hub`` reads them) and ``DOCKER_CONFIG``
(Docker's ``config.json``, for registry credentials), ``CUDA_VISIBLE_DEVICES``/``HIP_VISIBLE_DEVICES``
(the GPUs the daemon may use), and the model folders of Ollama, Hugging Face, llama.cpp and LM
Studio (``OLLAMA_MODELS``, ``HF_HUB_CACHE``, ``LLAMA_CACHE``), and systemd's ``NOTIFY_SOCKET``,
``WATCHDOG_USEC`` and ``WATCHDOG_PID``. They have no config-file key and no
``config list`` row; :func:`llmman.config.settings.load_settings` reads them from the same environment
as the settings and hands them on as :attr:`Settings.environment`, so no other module looks at
``os.environ``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llmman.config.model_dirs import ModelDirs, home, model_dirs

__all__ = ["HF_DEFAULT_ENDPOINT", "Environment", "home", "read_environment"]

HF_DEFAULT_ENDPOINT = "https://huggingface.co"
VISIBLE_DEVICES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Environment:
    """Other tools' variables, typed.

    Attributes:
        path: ``PATH``, searched for ``llama-server`` when no binary is configured.
        hf_endpoint: ``HF_ENDPOINT`` without a trailing ``/``, default https://huggingface.co.
        hf_token_path: the Hugging Face token file ``llmman login hf.co`` writes: ``HF_TOKEN_PATH``, else
            ``$HF_HOME/token``, else ``$XDG_CACHE_HOME/huggingface/token`` or
            ``~/.cache/huggingface/token`` (where ``huggingface_hub`` looks for it).
        docker_config: Docker's client config: ``$DOCKER_CONFIG/config.json``, else
            ``~/.docker/config.json``.
        visible_devices: the daemon's own ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` (those set),
            which limit the GPUs llmman discovers (llmman.sched.gpu.discover).
        model_dirs: where Ollama, Hugging Face, llama.cpp and LM Studio keep their models
            (``OLLAMA_MODELS``, ``HF_HUB_CACHE``/``HF_HOME``, ``LLAMA_CACHE``; llmman.config.model_dirs),
            the folders ``llmman import`` reads by keyword.
        notify_socket: systemd's ``NOTIFY_SOCKET`` (``Type=notify``: where ``READY=1`` and ``WATCHDOG=1`` go).
        watchdog_usec: systemd's ``WATCHDOG_USEC`` (``WatchdogSec=`` in microseconds; 0 = no watchdog).
        watchdog_pid: systemd's ``WATCHDOG_PID`` (the process the watchdog is meant for; 0 = any).
    """

    path: str
    hf_endpoint: str
    hf_token_path: Path
    docker_config: Path
    visible_devices: Mapping[str, str] = field(default_factory=dict)
    model_dirs: ModelDirs = field(default_factory=lambda: model_dirs({}))
    notify_socket: str = ""
    watchdog_usec: int = 0
    watchdog_pid: int = 0


def _path(text: str, env: Mapping[str, str]) -> Path:
    """``text`` as a path, a leading ``~`` meaning :func:`home`."""
    if text == "~" or text.startswith("~/"):
        return home(env) / text[2:]
    return Path(text)


def read_environment(env: Mapping[str, str]) -> Environment:
    """The :class:`Environment` that ``env`` describes, resolved as ``huggingface_hub`` and Docker
    resolve these variables (an empty variable counts as unset)."""
    cache = env.get("XDG_CACHE_HOME") or "~/.cache"
    hf_home = _path(env.get("HF_HOME") or f"{cache.rstrip('/')}/huggingface", env)
    token = _path(env["HF_TOKEN_PATH"], env) if env.get("HF_TOKEN_PATH") else hf_home / "token"
    docker = _path(env["DOCKER_CONFIG"], env) if env.get("DOCKER_CONFIG") else home(env) / ".docker"
    return Environment(
        path=env.get("PATH", ""),
        hf_endpoint=env.get("HF_ENDPOINT", "").rstrip("/") or HF_DEFAULT_ENDPOINT,
        hf_token_path=token,
        docker_config=docker / "config.json",
        visible_devices={k: env[k] for k in VISIBLE_DEVICES if k in env},
        model_dirs=model_dirs(env),
        notify_socket=env.get("NOTIFY_SOCKET", ""),
        watchdog_usec=_int(env.get("WATCHDOG_USEC", "")),
        watchdog_pid=_int(env.get("WATCHDOG_PID", "")),
    )


def _int(text: str) -> int:
    """A variable that systemd sets to a decimal number; anything else (unset, garbage) is 0."""
    return int(text) if text.isascii() and text.isdigit() else 0  # '²'.isdigit() is True, int('²') fails
