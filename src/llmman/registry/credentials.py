"""Registry credentials: llmman's own ``auth.json`` and Docker's ``config.json`` (with credential helpers).

Both files use Docker's format (``{"auths": {"host": {"auth": base64("user:pass")}}}``). Lookup order for a
registry host: llmman's file (written by ``llmman login``; ``registry.auth_file``), then Docker's
``config.json`` (``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``, resolved by
:mod:`llmman.config.environment`): ``credHelpers[host]``, ``credsStore``, then ``auths``. Docker Hub is
looked up under ``docker.io``, ``index.docker.io``, ``https://index.docker.io/v1/`` and
``registry-1.docker.io`` (different tools store Hub credentials under different ones). A credential
helper gets 5 seconds.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmman.errors import LlmmanError
from llmman.store.layout import atomic_write

if TYPE_CHECKING:
    from llmman.config.settings import Settings

HELPER_TIMEOUT_S = 5.0
_HUB = ("docker.io", "index.docker.io", "https://index.docker.io/v1/", "registry-1.docker.io")


@dataclass(frozen=True)
class Credential:
    """A user name and password (or an identity token when ``username`` is ``<token>``)."""

    username: str
    password: str


def _aliases(host: str) -> tuple[str, ...]:
    host = host.lower()
    if host in _HUB:
        return _HUB
    return (host, f"https://{host}", f"http://{host}")


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise LlmmanError(f"unreadable credentials file {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _from_auths(config: dict[str, Any], host: str) -> Credential | None:
    auths = config.get("auths")
    if not isinstance(auths, dict):
        return None
    for key in _aliases(host):
        entry = auths.get(key)
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("identitytoken"), str) and entry["identitytoken"]:
            return Credential("<token>", entry["identitytoken"])
        raw = entry.get("auth")
        if isinstance(raw, str) and raw:
            user, _, password = base64.b64decode(raw).decode("utf-8", "replace").partition(":")
            return Credential(user, password)
    return None


def _from_helper(helper: str, host: str) -> Credential | None:
    for key in _aliases(host):
        try:
            out = subprocess.run([f"docker-credential-{helper}", "get"], input=key.encode(),
                                 capture_output=True, timeout=HELPER_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode != 0:
            continue
        try:
            data = json.loads(out.stdout)
        except ValueError:
            continue
        user, secret = str(data.get("Username") or ""), str(data.get("Secret") or "")
        if secret:
            return Credential(user or "<token>", secret)
    return None


class CredentialStore:
    """Credentials for registry hosts.

    Args:
        path: llmman's own file (``registry.auth_file``).
        docker_config: Docker's ``config.json``; None = none is read.
    """

    def __init__(self, path: Path, docker_config: Path | None = None) -> None:
        self.path = Path(path)
        self.docker_config = docker_config

    @classmethod
    def of(cls, settings: Settings) -> CredentialStore:
        """The store ``settings`` configure: ``registry.auth_file``, then Docker's ``config.json``."""
        return cls(settings.auth_file, settings.environment.docker_config)

    def get(self, host: str) -> Credential | None:
        """The credential for ``host`` (see the module docstring for the order), or None."""
        found = _from_auths(_read(self.path), host)
        if found is not None:
            return found
        config = _read(self.docker_config) if self.docker_config is not None else {}
        helpers = config.get("credHelpers")
        helper = helpers.get(host) if isinstance(helpers, dict) else None
        helper = helper or config.get("credsStore")
        if isinstance(helper, str) and helper:
            found = _from_helper(helper, host)
            if found is not None:
                return found
        return _from_auths(config, host)

    def save(self, host: str, credential: Credential) -> None:
        """Store ``credential`` for ``host`` in llmman's file (mode 0600)."""
        config = _read(self.path)
        auths = config.setdefault("auths", {})
        raw = f"{credential.username}:{credential.password}".encode()
        auths[host.lower()] = {"auth": base64.b64encode(raw).decode()}
        self._write(config)

    def remove(self, host: str) -> bool:
        """Forget ``host``; True when something was removed."""
        config = _read(self.path)
        auths = config.get("auths")
        if not isinstance(auths, dict):
            return False
        removed = [k for k in _aliases(host) if auths.pop(k, None) is not None]
        if removed:
            self._write(config)
        return bool(removed)

    def _write(self, config: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(self.path, json.dumps(config, indent=2).encode() + b"\n")
        os.chmod(self.path, 0o600)
