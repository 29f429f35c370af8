"""Benchmark: what the OpenAI stream fixes (llmman.protocol.openai.stream) cost per chunk of a relayed stream.

Usage: ``.venv/bin/python bench/bench_transducer.py [--streams N]``. No daemon, no model: a chat stream shaped
like llama-server b11434's (a role chunk, 64 one-word chunks, a finish chunk, ``[DONE]``) goes through the
relay's :class:`~llmman.protocol.transducer.Passthrough` with the model echo only (the relay before the
fixes) and with the echo and :class:`~llmman.protocol.openai.stream.OpenAIStream` (after), and through the
fixes on a stream that needs them (no role chunk, ``created`` drifting every chunk). Best of 3 x 5 runs,
interleaved, microseconds per chunk; only reported, never asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from llmman.protocol.errors import Dialect
from llmman.protocol.model_echo import ModelEcho
from llmman.protocol.openai.stream import Kind, OpenAIStream
from llmman.protocol.transducer import Passthrough

ALIAS, NAME = "docker.io/ai/smollm2:135m", "smollm2:135m"


def chunk(created: int, delta: dict[str, object], finish: str | None = None) -> bytes:
    obj = {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}], "created": created,
           "id": "chatcmpl-YJ3w7z1vs38VrYOVVVfSBohOqjfdMoZc", "model": ALIAS,
           "system_fingerprint": "b11434-unknown", "object": "chat.completion.chunk"}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def stream(drift: bool) -> list[bytes]:
    body = [chunk(1796149776 + (i if drift else 0), {"content": " word"}) for i in range(64)]
    role = [] if drift else [chunk(1796149776, {"role": "assistant", "content": None})]
    return [*role, *body, chunk(1796149776, {}, "length"), b"data: [DONE]\n\n"]


def per_chunk(make: Callable[[], Passthrough], chunks: list[bytes], streams: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(streams):
            relay = make()
            for c in chunks:
                relay.feed(c)
            relay.close()
        best = min(best, (time.perf_counter() - start) / (streams * len(chunks)))
    return best * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=2000)
    args = parser.parse_args()
    echo = lambda: ModelEcho.between(ALIAS, NAME)  # noqa: E731
    cases: list[tuple[Callable[[], Passthrough], list[bytes]]] = [
        (lambda: Passthrough(Dialect.OPENAI, echo()), stream(False)),
        (lambda: Passthrough(Dialect.OPENAI, echo(), OpenAIStream(Kind.CHAT)), stream(False)),
        (lambda: Passthrough(Dialect.OPENAI, echo(), OpenAIStream(Kind.CHAT)), stream(True)),
    ]
    best = [float("inf")] * len(cases)
    for _ in range(3):  # interleaved, so a warm-up or a busy moment does not fall on one case
        for n, (make, chunks) in enumerate(cases):
            best[n] = min(best[n], per_chunk(make, chunks, args.streams))
    before, after, fixing = best
    print(f"echo only (before)            {before:7.2f} us/chunk")
    print(f"echo + fixes (after)          {after:7.2f} us/chunk  ({after / before:.3f}x)")
    print(f"echo + fixes, stream to fix   {fixing:7.2f} us/chunk  ({fixing / before:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
