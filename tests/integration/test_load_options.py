"""Ollama's load options are honoured or refused, never dropped (issue 14 item 6), with the real
llama-server and SmolLM2-135M: each becomes its flag on the child's command line (``/proc/<pid>/cmdline``),
a request with other load options reloads the model (Ollama's needsReload), one without any is served
by the loaded child, and a value llama-server cannot take is a 400 in Ollama's shape."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmman.refs import parse_reference
from llmman.store import Store
from tests.integration.daemons import HOP, Daemon, Nodes, hop_pair

pytestmark = [pytest.mark.integration, pytest.mark.model, pytest.mark.timeout(300)]

MODEL = "docker.io/ai/smollm2:135m"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    model = os.environ.get("LLMMAN_TEST_MODEL")
    if not model:
        pytest.skip("LLMMAN_TEST_MODEL is not set")
    hosts = "127.0.0.51", "127.0.0.52"
    back_tmp, front_tmp = tmp_path_factory.mktemp("back"), tmp_path_factory.mktemp("front")
    Store(back_tmp / "store").build(parse_reference("smollm2:135m"), Path(model))
    with hop_pair(back_tmp, front_tmp, hosts) as pair:
        yield pair


@pytest.fixture(scope="module")
def daemon(nodes: Nodes) -> Daemon:
    """The daemon that stores and runs the model."""
    return nodes.back


def generate(d: Daemon, options: dict[str, Any] | None = None,
             route: str = "/api/generate") -> httpx.Response:
    body: dict[str, Any] = {"model": "smollm2:135m", "stream": False,
                            "options": {"num_predict": 2, **(options or {})}}
    if route == "/api/chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return httpx.post(d.url + route, json=body, timeout=120)


def child(d: Daemon) -> tuple[int, list[str]]:
    """The one llama-server child's pid and its command line as the kernel has it."""
    r = httpx.get(d.url + "/api/ps", headers=HOP, timeout=10)
    (entry,) = [m for m in r.json()["models"] if m["model"] == MODEL]
    pid = int(entry["pid"])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return pid, [part.decode() for part in argv if part]


def flag(argv: list[str], name: str) -> str | None:
    """The value after the last ``name`` in ``argv`` (llama-server: the last one wins), or None."""
    values = [argv[i + 1] for i, part in enumerate(argv[:-1]) if part == name]
    return values[-1] if values else None


def test_each_load_option_is_its_llama_server_flag(daemon: Daemon) -> None:
    r = generate(daemon, {"num_thread": 2, "num_batch": 64, "num_gpu": 0, "main_gpu": 0,
                          "use_mmap": False, "use_mlock": False})
    assert r.status_code == 200, r.text
    _, argv = child(daemon)
    assert flag(argv, "-t") == "2"
    assert flag(argv, "-b") == "64" and flag(argv, "-ub") == "64"  # Ollama's one batch size for both
    assert flag(argv, "-ngl") == "0" and flag(argv, "-dev") == "none"  # CPU only: no device at all
    assert flag(argv, "-mg") == "0"
    assert flag(argv, "-lm") == "none"  # use_mmap false: llama-server b11434's --load-mode none


def test_other_load_options_reload_and_none_reuse_the_child(daemon: Daemon) -> None:
    assert generate(daemon, {"num_thread": 2}).status_code == 200
    first, argv = child(daemon)
    assert flag(argv, "-t") == "2"

    assert generate(daemon).status_code == 200  # no load options: whatever is loaded serves it
    assert child(daemon)[0] == first
    assert generate(daemon, {"num_thread": 2, "temperature": 0.1}).status_code == 200  # the same ones
    assert child(daemon)[0] == first

    assert generate(daemon, {"num_thread": 1, "use_mmap": True}).status_code == 200  # others: reloaded
    second, argv = child(daemon)
    assert second != first
    assert flag(argv, "-t") == "1" and flag(argv, "-lm") == "mmap"
    assert not Path(f"/proc/{first}").exists() or first not in [c.pid for c in daemon.children()]


@pytest.mark.parametrize(("options", "words"), [
    ({"num_batch": 0}, 'option "num_batch" must be at least 1, got 0'),
    ({"num_gpu": -3}, 'option "num_gpu" must be -1 (automatic) or at least 0, got -3'),
    ({"num_thread": -2}, 'option "num_thread" must be 0 (automatic) or at least 1, got -2'),
    ({"use_mmap": "no"}, 'option "use_mmap" must be of type boolean'),
])  # fmt: skip
def test_a_load_option_llama_server_cannot_take_is_a_400(daemon: Daemon, options: dict[str, Any],
                                                          words: str) -> None:
    r = generate(daemon, options)
    assert r.status_code == 400
    assert r.json() == {"error": words}


@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
def test_load_options_survive_a_hop(nodes: Nodes, route: str) -> None:
    """Sent to a node that stores nothing, the request runs on its peer with the options it gave."""
    r = generate(nodes.front, {"num_thread": 3, "num_batch": 96}, route)
    assert r.status_code == 200, r.text
    assert not nodes.front.children()  # served by the peer
    first, argv = child(nodes.back)
    assert flag(argv, "-t") == "3" and flag(argv, "-b") == "96"
    assert generate(nodes.front, {"num_thread": 4}, route).status_code == 200
    second, argv = child(nodes.back)
    assert second != first and flag(argv, "-t") == "4"  # reloaded on the peer
    bad = generate(nodes.front, {"num_batch": -5}, route)
    assert bad.status_code == 400 and bad.json() == {"error": 'option "num_batch" must be at least 1, got -5'}
