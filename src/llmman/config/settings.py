"""Typed, layered configuration, each value remembering where it came from.

Layers, later wins: defaults < ``/etc/llmman/llmman.conf`` < ``~/.config/llmman/llmman.conf``
(``$XDG_CONFIG_HOME`` respected; the same paths on every OS, as upstream llmman) < environment
``LLMMAN_*`` (then the Ollama variable where one is listed) < command-line flags. The settings are the
table in :mod:`llmman.config.table`; files are TOML with a ``[server]`` section and a free-form
``[aliases]`` table. Unknown sections or keys and wrongly typed values are errors.

This package is the only reader of ``os.environ``; everything else receives a :class:`Settings`,
other tools' variables (``PATH``, ``HF_*``, ``DOCKER_CONFIG``) included, as :attr:`Settings.environment`.
``llmman config set|unset`` edit the user file with tomlkit, keeping comments and layout.
"""

from __future__ import annotations

import os
import platform
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs
import tomlkit
import tomlkit.exceptions

from llmman.config.environment import Environment, home, read_environment
from llmman.config.presets import MODELS, Preset, display_preset, parse_preset
from llmman.config.table import (
    SETTINGS,
    HostAddress,
    Kind,
    SettingSpec,
    convert,
    display,
    parse_host,
    split_list,
)
from llmman.errors import ConfigError

__all__ = [
    "SETTINGS",
    "Environment",
    "HostAddress",
    "SettingSpec",
    "Settings",
    "alias_key",
    "config_get",
    "config_list",
    "config_set",
    "config_unset",
    "load_settings",
    "parse_host",
    "system_config_path",
    "user_config_path",
]

ALIASES = "aliases"
_BY_KEY = {spec.key: spec for spec in SETTINGS}
_SECTIONS = {spec.key.split(".", 1)[0] for spec in SETTINGS} | {ALIASES, MODELS}


@dataclass(frozen=True)
class Settings:
    """The effective configuration. Durations are seconds (``math.inf`` = forever).

    ``origins`` maps each dotted key (``server.host``, ``aliases.<name>``) to ``"default"``, the file it
    came from, ``"env LLMMAN_X"`` / ``"env OLLAMA_X"``, or ``"flag"``. ``environment`` holds the other
    tools' variables read from the same environment (:mod:`llmman.config.environment`).
    """

    host: HostAddress
    models: Path
    keep_alive: float
    num_parallel: int
    context_length: int
    max_loaded_models: int
    max_queue: int
    load_timeout: float
    llama_server: str
    shutdown_grace: float
    debug: bool
    offline: bool
    allowed_origins: str = ""
    max_body_size: int = 64 << 20
    body_timeout: float = 60.0
    import_dirs: tuple[str, ...] = ()
    scan_dirs: tuple[str, ...] = ()
    memory: int = 0
    reserve: int = 0
    peers: str = ""
    dns_server: str = ""
    api_key: str = ""
    spread: str = "replicas"
    max_replicas: int = 0
    replica_after: float = 2.0
    refresh: float = 1.0
    stall_timeout: float = 5.0
    affinity: bool = True
    serve: bool = False
    bind: str = ""
    ports: str = ""
    cache: bool = True
    lease: float = 30.0
    name: str = ""
    fallback: bool = False
    requests: bool = True
    bodies: str = "off"
    retention: float = 7 * 86400.0
    max_size: int = 256 << 20
    file_size: int = 10 << 20
    file_count: int = 3
    collect: bool = True
    scrape_key: str = ""
    api_keys: str = ""
    enforce: bool = True
    client_key: str = ""
    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    health_interval: float = 10.0
    blob_port: int = 0
    restart_backoff: float = 1.0
    insecure_registries: tuple[str, ...] = ()
    auth_file: Path = Path("auth.json")
    environment: Environment = field(default_factory=lambda: read_environment({}))
    aliases: dict[str, str] = field(default_factory=dict)
    presets: dict[str, Preset] = field(default_factory=dict)  # [models."REF"], by full reference
    origins: dict[str, str] = field(default_factory=dict)

    @property
    def api_key_list(self) -> tuple[str, ...]:
        """``auth.api_keys`` parsed: the keys, stripped, blanks dropped."""
        return split_list(self.api_keys)

    @property
    def origin_list(self) -> tuple[str, ...]:
        """``server.allowed_origins`` parsed: the extra CORS origin patterns."""
        return split_list(self.allowed_origins)

    @property
    def peer_list(self) -> tuple[str, ...]:
        """``aggregation.peers`` parsed: one ``LLMMAN_HOST``-style entry per peer."""
        return split_list(self.peers)

    @property
    def rpc_ports(self) -> tuple[int, int] | None:
        """``rpc.ports`` parsed: ``(first, last)``, or None when empty (free ports).

        Raises:
            ConfigError: not ``FIRST-LAST`` (or one port) within 1-65535, first <= last.
        """
        text = self.ports.strip()
        if not text:
            return None
        first, _, last = text.partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            low = high = 0
        if not 1 <= low <= high <= 65535:
            raise ConfigError(f"rpc.ports must be FIRST-LAST within 1-65535 (like 50052-50067), got {text!r}")
        return low, high

    @property
    def node_name(self) -> str:
        """This node's name in the pool: ``node.name``, else the host name."""
        return self.name.strip() or platform.node() or "localhost"

    @property
    def data_dir(self) -> Path:
        """llmman's data directory, the store's parent (``~/.local/share/llmman``)."""
        return self.models.parent

    @property
    def logs_dir(self) -> Path:
        """Per-model and daemon logs: ``<data_dir>/logs``."""
        return self.data_dir / "logs"


def user_config_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/llmman/llmman.conf``, else ``~/.config/llmman/llmman.conf`` (every OS).

    ``env`` defaults to ``os.environ``; a relative ``XDG_CONFIG_HOME`` is ignored, as the XDG spec says.
    """
    env = os.environ if env is None else env
    xdg = env.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else home(env) / ".config"
    return base / "llmman" / "llmman.conf"


def system_config_path() -> Path:
    """``/etc/llmman/llmman.conf`` (every OS)."""
    return Path("/etc/llmman/llmman.conf")


def _default_store(env: Mapping[str, str]) -> Path:
    """The platform's user data dir + ``llmman/store`` (``$XDG_DATA_HOME`` or ``~/.local/share`` on Linux)."""
    if sys.platform.startswith("linux") or "bsd" in sys.platform:
        xdg = env.get("XDG_DATA_HOME", "")
        base = Path(xdg) if xdg and Path(xdg).is_absolute() else home(env) / ".local" / "share"
        return base / "llmman" / "store"
    return Path(platformdirs.user_data_dir("llmman", appauthor=False)) / "store"


def _default_auth_file(env: Mapping[str, str]) -> Path:
    """The platform's user config dir + ``llmman/auth.json`` (``$XDG_CONFIG_HOME`` or ``~/.config`` on
    Linux)."""
    if sys.platform.startswith("linux") or "bsd" in sys.platform:
        return user_config_path(env).parent / "auth.json"
    return Path(platformdirs.user_config_dir("llmman", appauthor=False)) / "auth.json"


_COMPUTED_DEFAULTS = {"server.models": _default_store, "registry.auth_file": _default_auth_file}


def load_settings(
    *,
    flags: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    system_file: Path | None = None,
    user_file: Path | None = None,
) -> Settings:
    """Build the effective :class:`Settings` from every layer.

    Args:
        flags: command-line values keyed by dotted key (``{"server.models": "/tmp/s"}``); a None value
            means the flag was not given. Values may be strings or already typed.
        env: the environment (default ``os.environ``). An empty variable counts as unset (as Ollama);
            an Ollama fallback of ``0`` meaning "automatic" (``OLLAMA_NUM_PARALLEL=0``) is skipped.
        system_file, user_file: the config files (default :func:`system_config_path`,
            :func:`user_config_path`); a missing file is skipped.

    Raises:
        ConfigError: an unreadable or invalid file (naming the file and key), an environment value that
            does not parse (naming the variable), an unknown or invalid flag.
    """
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    origins: dict[str, str] = {}
    for spec in SETTINGS:
        if spec.key in _COMPUTED_DEFAULTS:
            values[spec.key] = _COMPUTED_DEFAULTS[spec.key](env)
        else:
            values[spec.key] = convert(spec, spec.default, strict_types=False)
        origins[spec.key] = "default"
    aliases: dict[str, str] = {}
    presets: dict[str, Preset] = {}

    for path in (system_file or system_config_path(), user_file or user_config_path(env)):
        for key, value in _read_file(path).items():
            if isinstance(key, tuple) and key[0] == MODELS and isinstance(value, Preset):
                presets[key[1]] = value  # a later file's preset replaces an earlier one's, whole
                origins[f'{MODELS}."{key[1]}"'] = str(path)
            elif isinstance(key, tuple):
                aliases[key[1]] = str(value)
                origins[alias_key(key[1])] = str(path)
            else:
                values[key] = value
                origins[key] = str(path)

    for spec in SETTINGS:
        for name in (spec.env, spec.ollama_env):
            if name and name in env and (env[name] != "" or (spec.empty_env and name == spec.env)):
                if name == spec.ollama_env and _ollama_auto(spec, env[name]):
                    continue
                try:
                    values[spec.key] = convert(spec, env[name], strict_types=False)
                except ValueError as exc:
                    raise ConfigError(f"invalid value for environment variable {name}: {exc}") from None
                origins[spec.key] = f"env {name}"
                break

    for key, raw in (flags or {}).items():
        if raw is None:
            continue
        flag_spec, alias = _lookup(key)
        if flag_spec is None:
            aliases[alias] = _check_alias(alias, raw)
            key = alias_key(alias)
        else:
            try:
                values[key] = convert(flag_spec, raw, strict_types=False)
            except ValueError as exc:
                raise ConfigError(f"invalid value for {key}: {exc}") from None
        origins[key] = "flag"

    typed: dict[str, Any] = {spec.attr: values[spec.key] for spec in SETTINGS}
    return Settings(**typed, environment=read_environment(env), aliases=aliases, presets=presets,
                    origins=origins)


def _ollama_auto(spec: SettingSpec, text: str) -> bool:
    """True for an Ollama fallback of ``0`` where Ollama reads 0 as "automatic" but llmman needs at
    least 1 (``OLLAMA_NUM_PARALLEL=0``, ``OLLAMA_CONTEXT_LENGTH=0``): such a value is skipped."""
    return spec.kind is Kind.INT and (spec.minimum or 0) > 0 and text.strip() == "0"


def _lookup(key: str) -> tuple[SettingSpec | None, str]:
    """Resolve a dotted key to its spec, or ``(None, alias_name)`` for ``aliases.<name>``.

    Raises:
        ConfigError: an unknown key.
    """
    if key in _BY_KEY:
        return _BY_KEY[key], ""
    section, _, name = key.partition(".")
    if section == ALIASES and name:
        if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
            name = name[1:-1]
        if name:
            return None, name
    raise ConfigError(f"unknown configuration key {key!r}")


def alias_key(name: str) -> str:
    """The dotted key of alias ``name``: ``aliases.gemma``, or ``aliases."my.model"`` when the name is not
    a bare TOML key (letters, digits, ``_`` and ``-``)."""
    bare = name and all(ch.isascii() and (ch.isalnum() or ch in "_-") for ch in name)
    return f"{ALIASES}.{name}" if bare else f'{ALIASES}."{name}"'


def _check_alias(name: str, target: object) -> str:
    if not isinstance(target, str) or not target.strip() or any(ch.isspace() for ch in target.strip()):
        raise ConfigError(f"alias {name!r} must map to a model reference string, got {target!r}")
    return target.strip()


def _read_file(path: Path) -> dict[str | tuple[str, str], object]:
    """Parse and validate one TOML file into ``{dotted key: typed value}`` (aliases keyed
    ``("aliases", name)``); ``{}`` when the file is absent.

    Raises:
        ConfigError: the file is unreadable, not TOML, has an unknown section or key, or a bad value.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    out: dict[str | tuple[str, str], object] = {}
    for section, table in data.items():
        if section not in _SECTIONS:
            raise ConfigError(f"{path}: unknown configuration key {section!r}")
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {section!r} must be a table ([{section}])")
        for name, raw in table.items():
            key = f"{section}.{name}"
            if section == MODELS:
                try:
                    preset = parse_preset(name, raw)
                except ConfigError as exc:
                    raise ConfigError(f"{path}: {exc}") from None
                out[(MODELS, preset.reference)] = preset
                continue
            if section == ALIASES:
                try:
                    out[(ALIASES, name)] = _check_alias(name, raw)
                except ConfigError as exc:
                    raise ConfigError(f"{path}: {exc}") from None
                continue
            spec = _BY_KEY.get(key)
            if spec is None:
                raise ConfigError(f"{path}: unknown configuration key {key!r}")
            try:
                out[key] = convert(spec, raw, strict_types=True)
            except ValueError as exc:
                raise ConfigError(f"{path}: invalid value for {key}: {exc}") from None
    return out


def config_get(settings: Settings, key: str) -> str:
    """The effective value of ``key`` as text (as ``config list`` shows it).

    Raises:
        ConfigError: an unknown key, or an alias that is not set.
    """
    spec, alias = _lookup(key)
    if spec is None:
        if alias not in settings.aliases:
            raise ConfigError(f"{key} is not set")
        return settings.aliases[alias]
    return display(spec, getattr(settings, spec.attr))


def config_list(settings: Settings) -> list[tuple[str, str, str]]:
    """``(key, value, origin)`` for every setting in table order, then each alias by name, then each
    preset key (``models."REF".context``) by reference."""
    rows = [
        (spec.key, display(spec, getattr(settings, spec.attr)), settings.origins.get(spec.key, "default"))
        for spec in SETTINGS
    ]
    for name in sorted(settings.aliases):
        key = alias_key(name)
        rows.append((key, settings.aliases[name], settings.origins.get(key, "default")))
    for reference in sorted(settings.presets):
        origin = settings.origins.get(f'{MODELS}."{reference}"', "default")
        rows.extend((key, text, origin) for key, text in display_preset(settings.presets[reference]))
    return rows


def _toml_value(spec: SettingSpec | None, text: str) -> object:
    """Validate ``text`` for ``spec`` and return what to write into the TOML file."""
    if spec is None:
        return text.strip()
    typed = convert(spec, text, strict_types=False)
    if spec.kind in (Kind.INT, Kind.BOOL):
        return typed
    if spec.kind is Kind.LIST and isinstance(typed, tuple):
        return list(typed)
    if spec.kind is Kind.DURATION:
        try:
            number = float(text)
        except ValueError:
            return text.strip()
        return int(number) if number.is_integer() else number
    return text.strip()


def _load_document(path: Path) -> tomlkit.TOMLDocument:
    try:
        return tomlkit.parse(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return tomlkit.document()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc}") from None
    except tomlkit.exceptions.TOMLKitError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def _write_document(path: Path, doc: tomlkit.TOMLDocument) -> None:
    """Write atomically (temp file + rename), keeping an existing file's mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(tomlkit.dumps(doc), encoding="utf-8")
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot write config file: {exc}") from None


def config_set(key: str, value: str, path: Path) -> None:
    """Set ``key`` to ``value`` in the TOML file at ``path``, keeping its comments and layout.

    ``value`` is text, as typed on the command line; it is converted and checked per the setting's type
    first (integers and booleans are written as TOML integers/booleans, durations as written). The file
    and its parent directories are created when missing.

    Raises:
        ConfigError: an unknown key, a value that does not parse, an unreadable or unwritable file.
    """
    spec, alias = _lookup(key)
    if spec is None:
        new: object = _check_alias(alias, value)
    else:
        try:
            new = _toml_value(spec, value)
        except ValueError as exc:
            raise ConfigError(f"invalid value for {key}: {exc}") from None
    section, name = (ALIASES, alias) if spec is None else tuple(spec.key.split(".", 1))
    doc = _load_document(path)
    if section not in doc:
        doc.add(section, tomlkit.table())
    table = doc[section]
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {section!r} is not a table")
    table[name] = new
    _write_document(path, doc)


def config_unset(key: str, path: Path) -> bool:
    """Remove ``key`` from the TOML file at ``path``, keeping everything else as it was.

    Returns:
        True when the key was present and removed; False when there was nothing to remove.

    Raises:
        ConfigError: an unknown key, an unreadable or unwritable file.
    """
    spec, alias = _lookup(key)
    section, name = (ALIASES, alias) if spec is None else tuple(spec.key.split(".", 1))
    if not path.exists():
        return False
    doc = _load_document(path)
    table = doc.get(section)
    if not isinstance(table, dict) or name not in table:
        return False
    del table[name]
    _write_document(path, doc)
    return True
