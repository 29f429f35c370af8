"""``/api/ps`` lists a model once even when it runs a chat child and an ``--embeddings`` child."""

from __future__ import annotations

from typing import Any

from llmman.api.ollama_models import _one_row_per_model


def _row(name: str, processor: str, size: int, vram: int, expires: str, pid: int) -> dict[str, Any]:
    return {"name": name, "processor": processor, "size": size, "size_vram": vram, "expires_at": expires,
            "pid": pid}


def test_embedding_child_folds_into_the_chat_entry() -> None:
    rows = [
        (200.0, _row("m", "llama-server (embedding)", 10, 1, "later", 2)),
        (100.0, _row("m", "llama-server", 100, 5, "sooner", 1)),
        (50.0, _row("other", "llama-server", 7, 0, "x", 3)),
    ]
    merged = dict((r["name"], (e, r)) for e, r in _one_row_per_model(rows))
    expires, m = merged["m"]
    assert (m["processor"], m["size"], m["size_vram"], m["pid"]) == ("llama-server", 110, 6, 1)
    assert (expires, m["expires_at"]) == (200.0, "later")
    assert merged["other"][1]["size"] == 7 and len(merged) == 2


def test_an_embedding_child_alone_keeps_its_entry() -> None:
    rows = [(1.0, _row("m", "llama-server (embedding)", 10, 0, "t", 2))]
    assert _one_row_per_model(rows) == rows
