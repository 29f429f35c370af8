"""Memory-aware scheduling with real llama-server children: SmolLM2-135M and Gemma 3 270M under a
memory cap (``LLMMAN_MEMORY``) that holds either model alone but not both."""

from __future__ import annotations

import concurrent.futures
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmman.gguf import read_gguf
from llmman.refs import parse_reference
from llmman.sched.memory import estimate
from llmman.store import Store
from tests.integration.daemons import Daemon, start_daemon

SMOL, GEMMA, SMOL2 = "smollm2:135m", "gemma3:270m", "smolcopy:135m"
BUSY_TEXT = "server busy, please try again.  maximum pending requests exceeded"


@pytest.fixture(scope="session")
def gemma_file(model_file: Path) -> Path:
    path = Path(os.environ.get("LLMMAN_TEST_GEMMA") or model_file.parent / "gemma-3-270m-q4_k_m.gguf")
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail("CI must have Gemma 3 270M: run scripts/setup.sh --model")
        pytest.skip("Gemma 3 270M missing: run scripts/setup.sh --model")
    return path


def _variant(model_file: Path, tmp: Path) -> Path:
    """SmolLM2 with 64 zero bytes after its tensor data: another blob, so another child (a plain copy of
    the same file would share SMOL's child, see ModelPlan.child)."""
    path = tmp / "smol-variant.gguf"
    path.write_bytes(model_file.read_bytes() + bytes(64))
    return path


def _daemon(tmp: Path, model_file: Path, gemma_file: Path, **env: str) -> Daemon:
    store = Store(tmp / "store")
    store.build(parse_reference(SMOL), model_file)
    store.build(parse_reference(SMOL2), _variant(model_file, tmp))
    store.build(parse_reference(GEMMA), gemma_file)
    base = {"LLMMAN_NUM_PARALLEL": "1", "LLMMAN_CONTEXT_LENGTH": "2048", "LLMMAN_MEMORY": "400MB"}
    return start_daemon(tmp, extra_env=base | env)


@pytest.fixture
def capped(tmp_path: Path, model_file: Path, gemma_file: Path) -> Iterator[Daemon]:
    d = _daemon(tmp_path, model_file, gemma_file)
    yield d
    d.stop(signal.SIGTERM)


def _load(c: httpx.Client, model: str, **extra: object) -> None:
    r = c.post("/api/generate", json={"model": model, **extra})
    assert r.status_code == 200, r.text


def _loaded(c: httpx.Client) -> dict[str, dict[str, object]]:
    return {str(m["model"]).rsplit("/", 1)[-1]: m for m in c.get("/api/ps").json()["models"]}


def test_second_model_unloads_the_idle_first(capped: Daemon) -> None:
    with capped.client() as c:
        _load(c, SMOL)
        assert list(_loaded(c)) == ["smollm2:135m"]
        body = {"model": GEMMA, "prompt": "The sky is", "raw": True, "stream": False,
                "options": {"num_predict": 3}}
        r = c.post("/api/generate", json=body)
        assert r.status_code == 200, r.text
        assert list(_loaded(c)) == ["gemma3:270m"]
        node = c.get("/llmman/node").json()
        assert node["memory"] == 400_000_000
        (loaded_ref, loaded_bytes), = node["loaded"].items()
        assert loaded_ref.endswith("/gemma3:270m") and loaded_bytes > 200_000_000
        assert node["free"] == node["memory"] - loaded_bytes
        assert len(node["stored"]) == 3 and loaded_ref in node["stored"]
        assert (node["in_flight"], node["queued"]) == (0, 0)
        (ram,) = node["devices"]  # a host-only node: its RAM, with the node's capacity and every model
        assert (ram["index"], ram["name"], ram["memory"]) == (0, "system RAM", 400_000_000)
        assert (ram["planned"], ram["free"], ram["models"]) == (loaded_bytes, node["free"], [loaded_ref])
    assert "to make room for" in capped.log_text()


def test_busy_model_drains_before_it_is_unloaded(capped: Daemon) -> None:
    with capped.client() as c, concurrent.futures.ThreadPoolExecutor(1) as pool:
        _load(c, SMOL)
        body = {"model": SMOL, "prompt": "Count from one to fifty.", "options": {"num_predict": 40}}
        with c.stream("POST", "/api/generate", json=body) as stream:
            lines = stream.iter_lines()
            first = next(lines)
            assert '"done":false' in first.replace(" ", "")
            other = pool.submit(c.post, "/api/generate", json={"model": GEMMA, "keep_alive": "5m"})
            rest = list(lines)
        assert '"done":true' in rest[-1].replace(" ", "") and "error" not in rest[-1], rest[-1]
        assert other.result().status_code == 200
        assert list(_loaded(c)) == ["gemma3:270m"]
    assert "waits for" in capped.log_text()


def test_keep_alive_forever_is_the_last_to_go(tmp_path: Path, model_file: Path, gemma_file: Path) -> None:
    d = _daemon(tmp_path, model_file, gemma_file, LLMMAN_MEMORY="500MB")
    try:
        with d.client() as c:
            _load(c, SMOL, keep_alive=-1)
            _load(c, SMOL2)
            assert set(_loaded(c)) == {"smollm2:135m", "smolcopy:135m"}
            _load(c, GEMMA)
            assert set(_loaded(c)) == {"smollm2:135m", "gemma3:270m"}
    finally:
        d.stop(signal.SIGTERM)


def test_model_larger_than_the_node_names_both_figures(tmp_path: Path, model_file: Path,
                                                       gemma_file: Path) -> None:
    d = _daemon(tmp_path, model_file, gemma_file, LLMMAN_MEMORY="50MB")
    try:
        with d.client() as c:
            r = c.post("/api/generate", json={"model": SMOL, "prompt": "hi"})
            assert r.status_code == 500
            error = r.json()["error"]
            assert "needs" in error and "50.0 MB (50000000 B)" in error, error
            assert c.get("/api/ps").json()["models"] == []
            assert d.children() == []
    finally:
        d.stop(signal.SIGTERM)


def test_full_queue_answers_503_with_ollamas_text(tmp_path: Path, model_file: Path, gemma_file: Path) -> None:
    d = _daemon(tmp_path, model_file, gemma_file, LLMMAN_MAX_QUEUE="2")
    try:
        with d.client() as c, concurrent.futures.ThreadPoolExecutor(5) as pool:
            _load(c, SMOL)
            body = {"model": SMOL, "prompt": "Write a long story.", "stream": False,
                    "options": {"num_predict": 64}}
            answers = list(pool.map(lambda _: c.post("/api/generate", json=body), range(5)))
        busy = [r for r in answers if r.status_code == 503]
        assert busy and any(r.status_code == 200 for r in answers), [r.status_code for r in answers]
        for r in busy:
            assert r.json() == {"error": BUSY_TEXT}
            assert int(r.headers["Retry-After"]) >= 1
    finally:
        d.stop(signal.SIGTERM)


def test_smaller_num_ctx_reuses_the_loaded_model(capped: Daemon) -> None:
    with capped.client() as c:
        _load(c, SMOL, options={"num_ctx": 2048})
        before = _loaded(c)["smollm2:135m"]
        r = c.post("/api/generate", json={"model": SMOL, "prompt": "hi", "stream": False,
                                          "options": {"num_ctx": 1024, "num_predict": 2}})
        assert r.status_code == 200, r.text
        after = _loaded(c)["smollm2:135m"]
        assert (after["pid"], after["context_length"]) == (before["pid"], 2048)


@pytest.mark.parametrize("n_ctx", [1024, 4096])
def test_estimate_is_close_to_what_llama_server_reports(tmp_path: Path, model_file: Path, gemma_file: Path,
                                                        n_ctx: int) -> None:
    d = _daemon(tmp_path, model_file, gemma_file, LLMMAN_MEMORY="0", LLMMAN_CONTEXT_LENGTH=str(n_ctx))
    try:
        with d.client() as c:
            for name, path in ((SMOL, model_file), (GEMMA, gemma_file)):
                _load(c, name)
                reported = int(_loaded(c)[name]["size"])  # type: ignore[call-overload]
                predicted = estimate(read_gguf(path), n_ctx=n_ctx, n_parallel=1).total
                error = (predicted - reported) / reported
                print(f"{name} n_ctx {n_ctx}: estimate {predicted} B, reported {reported} B, {error:+.1%}")
                assert abs(error) < 0.10, (name, n_ctx, predicted, reported)
                assert _loaded(c)[name]["size_vram"] == 0  # a CPU build: everything in host memory
    finally:
        d.stop(signal.SIGTERM)
