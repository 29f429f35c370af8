from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from llmman.config.settings import (
    SETTINGS,
    HostAddress,
    Settings,
    alias_key,
    config_get,
    config_list,
    config_set,
    config_unset,
    load_settings,
    parse_host,
    system_config_path,
    user_config_path,
)
from llmman.config.table import parse_bool
from llmman.errors import ConfigError


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "etc" / "llmman.conf", tmp_path / "home" / "llmman.conf"


def load(files: tuple[Path, Path], env: dict[str, str] | None = None, **flags: object) -> Settings:
    system, user = files
    dotted = {key.replace("__", "."): value for key, value in flags.items()}
    return load_settings(
        flags=dotted, env=env or {"HOME": str(system.parent.parent)}, system_file=system, user_file=user
    )


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults and layering ---------------------------------------------------------------------------


def test_defaults(files: tuple[Path, Path], tmp_path: Path) -> None:
    s = load(files)
    assert s.host == HostAddress("http", "127.0.0.1", 17434)
    assert s.keep_alive == 300.0
    assert s.num_parallel == 4
    assert s.context_length == 4096
    assert s.max_loaded_models == 0
    assert s.max_queue == 512
    assert s.load_timeout == 300.0
    assert s.llama_server == ""
    assert s.shutdown_grace == 30.0
    assert s.debug is False
    assert s.aliases == {}
    assert set(s.origins) == {spec.key for spec in SETTINGS}
    assert set(s.origins.values()) == {"default"}
    if sys.platform.startswith("linux"):
        assert s.models == tmp_path / ".local" / "share" / "llmman" / "store"
    assert s.data_dir == s.models.parent
    assert s.logs_dir == s.models.parent / "logs"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG data dir is the Linux layout")
def test_default_store_honours_xdg_data_home(files: tuple[Path, Path], tmp_path: Path) -> None:
    s = load(files, {"HOME": "/nowhere", "XDG_DATA_HOME": str(tmp_path / "data")})
    assert s.models == tmp_path / "data" / "llmman" / "store"


def test_layering_order_and_origins(files: tuple[Path, Path]) -> None:
    system, user = files
    write(system, '[server]\nkeep_alive = "1m"\nnum_parallel = 2\nmax_queue = 10\ncontext_length = 1024\n')
    write(user, "[server]\nnum_parallel = 3\nmax_queue = 20\ncontext_length = 2048\n")
    env = {"LLMMAN_MAX_QUEUE": "30", "LLMMAN_CONTEXT_LENGTH": "8192"}
    s = load(files, env, server__context_length="16384")

    assert (s.keep_alive, s.origins["server.keep_alive"]) == (60.0, str(system))
    assert (s.num_parallel, s.origins["server.num_parallel"]) == (3, str(user))
    assert (s.max_queue, s.origins["server.max_queue"]) == (30, "env LLMMAN_MAX_QUEUE")
    assert (s.context_length, s.origins["server.context_length"]) == (16384, "flag")
    assert (s.debug, s.origins["server.debug"]) == (False, "default")


def test_ollama_fallback_only_when_llmman_variable_absent(files: tuple[Path, Path]) -> None:
    s = load(files, {"OLLAMA_KEEP_ALIVE": "-1", "OLLAMA_NUM_PARALLEL": "2"})
    assert (s.keep_alive, s.origins["server.keep_alive"]) == (math.inf, "env OLLAMA_KEEP_ALIVE")
    assert (s.num_parallel, s.origins["server.num_parallel"]) == (2, "env OLLAMA_NUM_PARALLEL")

    s = load(files, {"OLLAMA_KEEP_ALIVE": "-1", "LLMMAN_KEEP_ALIVE": "10m"})
    assert (s.keep_alive, s.origins["server.keep_alive"]) == (600.0, "env LLMMAN_KEEP_ALIVE")

    # an empty variable counts as unset (as in Ollama's envconfig)
    s = load(files, {"OLLAMA_KEEP_ALIVE": "1h", "LLMMAN_KEEP_ALIVE": ""})
    assert (s.keep_alive, s.origins["server.keep_alive"]) == (3600.0, "env OLLAMA_KEEP_ALIVE")


def test_ollama_fallback_beats_files(files: tuple[Path, Path]) -> None:
    write(files[1], "[server]\nmax_loaded_models = 1\n")
    s = load(files, {"OLLAMA_MAX_LOADED_MODELS": "3"})
    assert (s.max_loaded_models, s.origins["server.max_loaded_models"]) == (3, "env OLLAMA_MAX_LOADED_MODELS")


def test_ollama_zero_meaning_automatic_is_skipped(files: tuple[Path, Path]) -> None:
    s = load(
        files, {"OLLAMA_NUM_PARALLEL": "0", "OLLAMA_CONTEXT_LENGTH": "0", "OLLAMA_MAX_LOADED_MODELS": "0"}
    )
    assert (s.num_parallel, s.origins["server.num_parallel"]) == (4, "default")
    assert (s.context_length, s.origins["server.context_length"]) == (4096, "default")
    assert s.origins["server.max_loaded_models"] == "env OLLAMA_MAX_LOADED_MODELS"
    with pytest.raises(ConfigError, match="LLMMAN_NUM_PARALLEL"):
        load(files, {"LLMMAN_NUM_PARALLEL": "0"})


def test_no_ollama_fallback_for_llmman_only_settings(files: tuple[Path, Path]) -> None:
    s = load(files, {"OLLAMA_HOST": "0.0.0.0:11434", "OLLAMA_MODELS": "/x", "OLLAMA_DEBUG": "1"})
    assert s.host.port == 17434
    assert s.origins["server.models"] == "default"
    assert s.debug is False


def test_every_setting_from_env(files: tuple[Path, Path]) -> None:
    env = {
        "HOME": "/h",
        "LLMMAN_HOST": "https://example.com",
        "LLMMAN_MODELS": "~/models",
        "LLMMAN_KEEP_ALIVE": "300",
        "LLMMAN_NUM_PARALLEL": "8",
        "LLMMAN_CONTEXT_LENGTH": "256",
        "LLMMAN_MAX_LOADED_MODELS": "2",
        "LLMMAN_MAX_QUEUE": "1",
        "LLMMAN_LOAD_TIMEOUT": "1h30m",
        "LLMMAN_LLAMA_SERVER": "/opt/llama/bin/llama-server",
        "LLMMAN_SHUTDOWN_GRACE": "500ms",
        "LLMMAN_HEALTH_INTERVAL": "2s",
        "LLMMAN_RESTART_BACKOFF": "250ms",
        "LLMMAN_DEBUG": "yes",
        "LLMMAN_MEMORY": "24GB",
        "LLMMAN_MEMORY_RESERVE": "512MiB",
        "LLMMAN_OFFLINE": "1",
        "LLMMAN_ORIGINS": "chrome-extension://*",
        "LLMMAN_MAX_BODY_SIZE": "8MiB",
        "LLMMAN_BODY_TIMEOUT": "5s",
        "LLMMAN_IMPORT_DIRS": "/srv/models, /data/gguf",
        "LLMMAN_PEERS": "",  # empty is a value here: "no peers" (aggregation opt-out)
        "LLMMAN_PEER_API_KEY": "pk",
        "LLMMAN_PEER_DNS": "127.0.0.1:5353",
        "LLMMAN_SPREAD": " Loaded ",
        "LLMMAN_MAX_REPLICAS": "3",
        "LLMMAN_REPLICA_AFTER": "500ms",
        "LLMMAN_PEER_REFRESH": "250ms",
        "LLMMAN_STALL_TIMEOUT": "2s",
        "LLMMAN_AFFINITY": "no",
        "LLMMAN_NODE_NAME": "spark",
        "LLMMAN_FALLBACK": "yes",
        "LLMMAN_LOG_REQUESTS": "off",
        "LLMMAN_LOG_BODIES": " Conversation ",
        "LLMMAN_LOG_RETENTION": "24h",
        "LLMMAN_LOG_MAX_SIZE": "1MiB",
        "LLMMAN_LOG_FILE_SIZE": "2MiB",
        "LLMMAN_LOG_FILE_COUNT": "5",
        "LLMMAN_METRICS_KEY": "scrape",
        "LLMMAN_METRICS": "off",
        "LLMMAN_MODELS_DIRS": "~/.ollama/models, /srv/gguf",
        "LLMMAN_API_KEYS": "k1,k2",
        "LLMMAN_API_KEY": "k2",
        "LLMMAN_AUTH": "off",
        "LLMMAN_TLS_CERT": "/c.pem",
        "LLMMAN_TLS_KEY": "/k.pem",
        "LLMMAN_TLS_CA": "/ca.pem",
        "LLMMAN_INSECURE_REGISTRIES": "reg.lan:5000, Other.lan",
        "LLMMAN_AUTH_FILE": "/creds/auth.json",
        "LLMMAN_RPC_SERVE": "1",
        "LLMMAN_RPC_BIND": "10.0.0.5",
        "LLMMAN_RPC_CACHE": "false",
        "LLMMAN_RPC_LEASE": "10s",
        "LLMMAN_BLOB_PORT": "17435",
        "LLMMAN_RPC_PORTS": "50052-50067",
    }
    s = load(files, env)
    assert s.host == HostAddress("https", "example.com", 443)
    assert s.models == Path("~/models").expanduser()
    assert (s.keep_alive, s.num_parallel, s.context_length) == (300.0, 8, 256)
    assert (s.max_loaded_models, s.max_queue, s.load_timeout) == (2, 1, 5400.0)
    assert s.llama_server == "/opt/llama/bin/llama-server"
    assert (s.shutdown_grace, s.health_interval, s.restart_backoff) == (0.5, 2.0, 0.25)
    assert s.debug is True
    assert (s.memory, s.reserve) == (24 * 10**9, 512 * 2**20)
    assert s.offline is True
    assert (s.max_body_size, s.body_timeout, s.import_dirs) == (8 << 20, 5.0, ("/srv/models", "/data/gguf"))
    assert s.allowed_origins == "chrome-extension://*"
    assert (s.peers, s.api_key, s.api_keys, s.enforce) == ("", "pk", "k1,k2", False)
    assert (s.cert_file, s.key_file, s.ca_file) == ("/c.pem", "/k.pem", "/ca.pem")
    assert s.insecure_registries == ("reg.lan:5000", "Other.lan")
    assert s.auth_file == Path("/creds/auth.json")
    assert (s.spread, s.max_replicas, s.replica_after, s.refresh) == ("loaded", 3, 0.5, 0.25)
    assert (s.stall_timeout, s.affinity, s.name, s.fallback) == (2.0, False, "spark", True)
    assert (s.requests, s.bodies, s.retention, s.max_size) == (False, "conversation", 86400.0, 1 << 20)
    assert (s.file_size, s.file_count) == (2 << 20, 5)
    assert (s.scrape_key, s.collect) == ("scrape", False)
    assert s.scan_dirs == ("~/.ollama/models", "/srv/gguf")
    assert (s.serve, s.bind, s.cache, s.lease) == (True, "10.0.0.5", False, 10.0)
    assert s.blob_port == 17435
    assert (s.ports, s.rpc_ports) == ("50052-50067", (50052, 50067))
    assert {origin for key, origin in s.origins.items()} == {f"env {spec.env}" for spec in SETTINGS}


# --- errors ------------------------------------------------------------------------------------------


def test_a_setting_with_choices_names_them(files: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError, match="expected one of off, loaded, replicas"):
        load(files, {"LLMMAN_SPREAD": "sometimes"})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[server]\nport = 1\n", "'server.port'"),
        ("[sever]\nhost = 'x'\n", "'sever'"),
        ("host = 'x'\n", "'host'"),
        ("[server.extra]\nx = 1\n", "'server.extra'"),
        ("[server]\nnum_parallel = '4'\n", "server.num_parallel: expected an integer, got a string"),
        ("[server]\nnum_parallel = true\n", "server.num_parallel: expected an integer, got a boolean"),
        ("[server]\nnum_parallel = 0\n", "server.num_parallel: must be at least 1"),
        ("[server]\ncontext_length = 100\n", "server.context_length: must be at least 256"),
        ("[server]\nmax_loaded_models = -1\n", "server.max_loaded_models: must be at least 0"),
        ("[server]\nhost = 17434\n", "server.host: expected a string, got an integer"),
        ("[server]\nhost = 'localhost:99999'\n", "bad port"),
        ("[server]\ndebug = 'yes'\n", "server.debug: expected a boolean, got a string"),
        ("[server]\nkeep_alive = 'soon'\n", 'time: invalid duration "soon"'),
        ("[server]\nkeep_alive = true\n", "unsupported type 'bool'"),
        ("[server]\nmodels = ''\n", "server.models: expected a path"),
        ("[server]\nllama_server = ['a']\n", "server.llama_server: expected a string, got an array"),
        ("[registry]\ninsecure_registries = 5\n", "registry.insecure_registries: expected a comma-separated"),
        ("[registry]\ninsecure_registries = ['a', 1]\n", "or an array of strings, got an array"),
        ("[aliases]\ng = 3\n", "alias 'g'"),
        ("[aliases]\ng = 'two words'\n", "alias 'g'"),
        ("server = 1\n", "'server' must be a table"),
        ("[server\n", "invalid TOML"),
    ],
)
def test_file_errors_name_the_file_and_key(files: tuple[Path, Path], text: str, needle: str) -> None:
    path = write(files[1], text)
    with pytest.raises(ConfigError) as info:
        load(files)
    assert str(path) in str(info.value)
    assert needle in str(info.value)


def test_system_file_errors_too(files: tuple[Path, Path]) -> None:
    write(files[0], "[server]\nbogus = 1\n")
    with pytest.raises(ConfigError, match="bogus"):
        load(files)


def test_unreadable_file(files: tuple[Path, Path]) -> None:
    files[1].mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(ConfigError, match="cannot read"):
        load(files)


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"LLMMAN_NUM_PARALLEL": "four"}, "LLMMAN_NUM_PARALLEL"),
        ({"OLLAMA_MAX_QUEUE": "many"}, "OLLAMA_MAX_QUEUE"),
        ({"LLMMAN_KEEP_ALIVE": "1d"}, "LLMMAN_KEEP_ALIVE"),
        ({"LLMMAN_HOST": "ftp://x"}, "LLMMAN_HOST"),
        ({"LLMMAN_DEBUG": "maybe"}, "LLMMAN_DEBUG"),
        ({"LLMMAN_CONTEXT_LENGTH": "255"}, "LLMMAN_CONTEXT_LENGTH"),
    ],
)
def test_env_errors_name_the_variable(files: tuple[Path, Path], env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=f"environment variable {variable}"):
        load(files, env)


def test_flags(files: tuple[Path, Path]) -> None:
    s = load(
        files,
        {"LLMMAN_HOST": "0.0.0.0"},
        server__host=None,
        server__models=Path("/srv/store"),
        server__num_parallel=2,
        server__debug=True,
        server__keep_alive=-1,
    )
    assert s.host.host == "0.0.0.0"  # None means "flag not given"
    assert s.origins["server.host"] == "env LLMMAN_HOST"
    assert (s.models, s.num_parallel, s.debug, s.keep_alive) == (Path("/srv/store"), 2, True, math.inf)
    assert s.origins["server.models"] == "flag"
    with pytest.raises(ConfigError, match=r"unknown configuration key 'server\.nope'"):
        load(files, server__nope="1")
    with pytest.raises(ConfigError, match=r"server\.num_parallel"):
        load(files, server__num_parallel="x")


def test_aliases_merge_across_files(files: tuple[Path, Path]) -> None:
    system, user = files
    write(system, '[aliases]\na = "gemma3"\nb = "smollm2:135m"\n')
    write(user, '[aliases]\nb = "hf.co/x/y:Q4_K_M"\n"my.model" = "unsloth/z"\n')
    s = load(files)
    assert s.aliases == {"a": "gemma3", "b": "hf.co/x/y:Q4_K_M", "my.model": "unsloth/z"}
    assert s.origins["aliases.a"] == str(system)
    assert s.origins["aliases.b"] == str(user)
    assert s.origins['aliases."my.model"'] == str(user)
    assert config_get(s, "aliases.b") == "hf.co/x/y:Q4_K_M"
    assert config_get(s, 'aliases."my.model"') == "unsloth/z"
    with pytest.raises(ConfigError, match="not set"):
        config_get(s, "aliases.zzz")


# --- paths -------------------------------------------------------------------------------------------


def test_config_paths() -> None:
    assert system_config_path() == Path("/etc/llmman/llmman.conf")
    assert user_config_path({"HOME": "/home/u"}) == Path("/home/u/.config/llmman/llmman.conf")
    assert user_config_path({"HOME": "/home/u", "XDG_CONFIG_HOME": "/cfg"}) == Path("/cfg/llmman/llmman.conf")
    # a relative XDG_CONFIG_HOME is invalid per the XDG spec and ignored
    assert user_config_path({"HOME": "/home/u", "XDG_CONFIG_HOME": "rel"}) == Path(
        "/home/u/.config/llmman/llmman.conf"
    )


def test_user_file_defaults_to_xdg_path(tmp_path: Path) -> None:
    write(tmp_path / "cfg" / "llmman" / "llmman.conf", "[server]\nmax_queue = 9\n")
    s = load_settings(
        env={"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg")},
        system_file=tmp_path / "none.conf",
    )
    assert s.max_queue == 9
    assert s.origins["server.max_queue"] == str(tmp_path / "cfg" / "llmman" / "llmman.conf")


# --- list / get ----------------------------------------------------------------------------------------


def test_config_list_and_get(files: tuple[Path, Path]) -> None:
    write(files[1], '[server]\nkeep_alive = -1\n[aliases]\ng = "gemma3"\n')
    s = load(files, {"LLMMAN_SHUTDOWN_GRACE": "90"})
    rows = config_list(s)
    assert [key for key, _, _ in rows] == [spec.key for spec in SETTINGS] + ["aliases.g"]
    table = {key: (value, origin) for key, value, origin in rows}
    assert table["server.host"] == ("http://127.0.0.1:17434", "default")
    assert table["server.keep_alive"] == ("forever", str(files[1]))
    assert table["server.shutdown_grace"] == ("1m30s", "env LLMMAN_SHUTDOWN_GRACE")
    assert table["server.load_timeout"] == ("5m0s", "default")
    assert table["server.debug"] == ("false", "default")
    assert table["aliases.g"] == ("gemma3", str(files[1]))
    assert config_get(s, "server.num_parallel") == "4"
    with pytest.raises(ConfigError, match="unknown configuration key"):
        config_get(s, "server.nope")


def test_alias_key_quotes_non_bare_names() -> None:
    assert alias_key("gemma") == "aliases.gemma"
    assert alias_key("my-model_2") == "aliases.my-model_2"
    assert alias_key("my.model") == 'aliases."my.model"'


# --- set / unset ---------------------------------------------------------------------------------------

COMMENTED = """\
# llmman settings, hand-written
[server]
# listen everywhere
host = "0.0.0.0:17434"  # LAN
keep_alive = "10m"

[aliases]
# my favourite
g = "gemma3"
"""


def test_config_set_and_unset_keep_comments(files: tuple[Path, Path]) -> None:
    user = write(files[1], COMMENTED)
    config_set("server.num_parallel", "8", user)
    config_set("server.keep_alive", "1h", user)
    config_set("server.debug", "on", user)
    config_set("server.load_timeout", "90", user)
    config_set("aliases.q", "qwen3.5:0.8b", user)
    config_set('aliases."my.model"', "unsloth/x:Q4_K_M", user)
    config_unset("aliases.g", user)
    text = user.read_text()
    for comment in ("# llmman settings, hand-written", "# listen everywhere", "# LAN", "# my favourite"):
        assert comment in text
    assert "num_parallel = 8\n" in text
    assert 'keep_alive = "1h"' in text
    assert "debug = true\n" in text
    assert "load_timeout = 90\n" in text
    assert 'g = "gemma3"' not in text

    s = load(files)
    assert (s.num_parallel, s.keep_alive, s.debug, s.load_timeout) == (8, 3600.0, True, 90.0)
    assert s.host.host == "0.0.0.0"
    assert s.aliases == {"q": "qwen3.5:0.8b", "my.model": "unsloth/x:Q4_K_M"}

    assert config_unset("server.host", user) is True
    assert config_unset("server.host", user) is False
    assert "# listen everywhere" in user.read_text()
    assert load(files).origins["server.host"] == "default"


def test_config_set_creates_file_and_dirs(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "llmman.conf"
    config_set("server.max_queue", "64", path)
    config_set("server.host", "'http://[::1]:9000/'", path)
    s = load_settings(env={}, system_file=tmp_path / "none", user_file=path)
    assert s.max_queue == 64
    assert s.host == HostAddress("http", "::1", 9000)
    assert config_unset("server.models", tmp_path / "missing.conf") is False
    assert not (tmp_path / "missing.conf").exists()


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("server.nope", "1", "unknown configuration key 'server.nope'"),
        ("nope", "1", "unknown configuration key 'nope'"),
        ("aliases", "x", "unknown configuration key 'aliases'"),
        ("server.num_parallel", "zero", "expected an integer"),
        ("server.num_parallel", "0", "must be at least 1"),
        ("server.keep_alive", "later", 'time: invalid duration "later"'),
        ("server.host", "http://x:abc", "bad port"),
        ("server.debug", "perhaps", "not a boolean"),
        ("aliases.x", "", "alias 'x'"),
    ],
)
def test_config_set_validates_before_writing(tmp_path: Path, key: str, value: str, needle: str) -> None:
    path = write(tmp_path / "llmman.conf", COMMENTED)
    with pytest.raises(ConfigError) as info:
        config_set(key, value, path)
    assert needle in str(info.value)
    assert path.read_text() == COMMENTED


def test_config_unset_unknown_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown configuration key"):
        config_unset("server.nope", tmp_path / "x.conf")


# --- host parsing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "url"),
    [
        ("", ("http", "127.0.0.1", 17434), "http://127.0.0.1:17434"),
        ("127.0.0.1:17434", ("http", "127.0.0.1", 17434), "http://127.0.0.1:17434"),
        ("0.0.0.0", ("http", "0.0.0.0", 17434), "http://127.0.0.1:17434"),
        (":8080", ("http", "127.0.0.1", 8080), "http://127.0.0.1:8080"),
        ("example.com", ("http", "example.com", 17434), "http://example.com:17434"),
        ("http://example.com", ("http", "example.com", 80), "http://example.com"),
        ("https://example.com", ("https", "example.com", 443), "https://example.com"),
        ("HTTPS://example.com:8443/some/path", ("https", "example.com", 8443), "https://example.com:8443"),
        ("http://10.0.0.5:17434/", ("http", "10.0.0.5", 17434), "http://10.0.0.5:17434"),
        ('"localhost:9000"', ("http", "localhost", 9000), "http://localhost:9000"),
        ("  'box.lan'  ", ("http", "box.lan", 17434), "http://box.lan:17434"),
        ("[::1]:9000", ("http", "::1", 9000), "http://[::1]:9000"),
        ("[::]:9000", ("http", "::", 9000), "http://[::1]:9000"),
        ("http://[fe80::1]", ("http", "fe80::1", 80), "http://[fe80::1]"),
        ("::1", ("http", "::1", 17434), "http://[::1]:17434"),
        ("[::1]", ("http", "::1", 17434), "http://[::1]:17434"),
        ("localhost:0", ("http", "localhost", 0), "http://localhost:0"),
    ],
)
def test_parse_host(text: str, expected: tuple[str, str, int], url: str) -> None:
    address = parse_host(text)
    assert (address.scheme, address.host, address.port) == expected
    assert address.bind_host == expected[1]
    assert address.client_url() == url


@pytest.mark.parametrize(
    "text",
    ["localhost:99999", "localhost:-1", "localhost:abc", "ftp://x", "[::1", "[::1]x", "a b:1", "u@h:1"],
)
def test_parse_host_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid host"):
        parse_host(text)


@pytest.mark.parametrize(
    ("text", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2:17434", True),
        ("localhost", True),
        ("[::1]:1", True),
        ("0.0.0.0", False),
        ("[::]:1", False),
        ("10.0.0.5", False),
        ("box.lan", False),
    ],
)
def test_is_loopback(text: str, loopback: bool) -> None:
    assert parse_host(text).is_loopback() is loopback


def test_host_str_and_netloc() -> None:
    assert str(parse_host("[::1]:9")) == "http://[::1]:9"
    assert parse_host("https://h").netloc == "h:443"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("2", True),
        ("-1", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("off", False),
        ("", False),
    ],
)
def test_parse_bool(text: str, value: bool) -> None:
    assert parse_bool(text) is value


def test_parse_bool_rejects() -> None:
    with pytest.raises(ValueError):
        parse_bool("maybe")


# --- lists, paths and other tools' variables ----------------------------------------------------------


def test_list_settings_are_parsed_once_into_tuples(files: tuple[Path, Path]) -> None:
    assert load(files).insecure_registries == ()
    s = load(files, {"LLMMAN_INSECURE_REGISTRIES": " a:5000 ,, b "})
    assert (s.insecure_registries, s.origins["registry.insecure_registries"]) == (
        ("a:5000", "b"), "env LLMMAN_INSECURE_REGISTRIES")
    write(files[1], '[registry]\ninsecure_registries = ["x:1", "y:2, z:3"]\n')
    assert load(files).insecure_registries == ("x:1", "y:2", "z:3")
    write(files[1], '[registry]\ninsecure_registries = "x:1,y:2"\n')
    assert load(files).insecure_registries == ("x:1", "y:2")
    assert load(files, registry__insecure_registries="f:1").insecure_registries == ("f:1",)
    assert config_get(load(files), "registry.insecure_registries") == "x:1,y:2"


def test_comma_string_settings_have_parsed_views(files: tuple[Path, Path]) -> None:
    env = {"LLMMAN_API_KEYS": " k1, k2 ", "LLMMAN_ORIGINS": "a://*, b://x", "LLMMAN_PEERS": "n1,n2:1"}
    s = load(files, env)
    assert s.api_key_list == ("k1", "k2")
    assert s.origin_list == ("a://*", "b://x")
    assert s.peer_list == ("n1", "n2:1")
    for blank in (" k1, ,k2 ", " , "):  # a blank key is a configuration error (issue 13 item 4)
        with pytest.raises(ConfigError, match="LLMMAN_API_KEYS"):
            load(files, {"LLMMAN_API_KEYS": blank})


def test_config_set_writes_a_list_as_an_array(tmp_path: Path) -> None:
    path = tmp_path / "llmman.conf"
    config_set("registry.insecure_registries", "a:1, b:2", path)
    assert 'insecure_registries = ["a:1", "b:2"]' in path.read_text()
    s = load_settings(env={}, system_file=tmp_path / "none", user_file=path)
    assert s.insecure_registries == ("a:1", "b:2")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG config dir is the Linux layout")
def test_auth_file_default_follows_the_user_config_dir(files: tuple[Path, Path], tmp_path: Path) -> None:
    assert load(files).auth_file == tmp_path / ".config" / "llmman" / "auth.json"
    s = load(files, {"HOME": "/nowhere", "XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert (s.auth_file, s.origins["registry.auth_file"]) == (tmp_path / "cfg" / "llmman" / "auth.json",
                                                              "default")
    write(files[1], '[registry]\nauth_file = "~/creds.json"\n')
    assert load(files).auth_file == Path("~/creds.json").expanduser()


def test_other_tools_variables_are_read_with_the_settings(files: tuple[Path, Path]) -> None:
    e = load(files, {"HOME": "/h"}).environment
    assert e.path == "" and e.hf_endpoint == "https://huggingface.co"
    assert e.hf_token_path == Path("/h/.cache/huggingface/token")
    assert e.docker_config == Path("/h/.docker/config.json")

    e = load(files, {"HOME": "/h", "PATH": "/bin:/usr/bin", "HF_ENDPOINT": "http://hub.lan:8080/",
                     "HF_HOME": "/hf", "DOCKER_CONFIG": "~/dockercfg"}).environment
    assert e.path == "/bin:/usr/bin" and e.hf_endpoint == "http://hub.lan:8080"
    assert e.hf_token_path == Path("/hf/token")
    assert e.docker_config == Path("/h/dockercfg/config.json")

    e = load(files, {"HOME": "/h", "XDG_CACHE_HOME": "/cache", "HF_TOKEN_PATH": ""}).environment
    assert e.hf_token_path == Path("/cache/huggingface/token")  # an empty variable counts as unset
    assert load(files, {"HOME": "/h", "HF_TOKEN_PATH": "/t/tok"}).environment.hf_token_path == Path("/t/tok")


@pytest.mark.parametrize("text", ["50052", "1-65535", " 7000-7000 "])
def test_rpc_ports_takes_a_range_or_one_port(files: tuple[Path, Path], text: str) -> None:
    low, _, high = text.strip().partition("-")
    assert load(files, {"LLMMAN_RPC_PORTS": text}).rpc_ports == (int(low), int(high or low))


@pytest.mark.parametrize("text", ["0-10", "9-8", "a-b", "70000", "1-2-3", "-5"])
def test_rpc_ports_refuses_what_is_not_a_range(files: tuple[Path, Path], text: str) -> None:
    with pytest.raises(ConfigError, match=r"rpc\.ports must be"):
        _ = load(files, {"LLMMAN_RPC_PORTS": text}).rpc_ports
