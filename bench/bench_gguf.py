"""Benchmark: llmman's GGUF header reader vs gguf-py's GGUFReader on a synthetic 150k-token vocabulary.

Usage: ``.venv/bin/python bench/bench_gguf.py [--merges N] [--repeat R]``. Writes a temporary GGUF with
150 000 tokens (strings), scores (f32) and token types (i32) — plus N merges, default 0 — before the chat
template, then prints the best-of-R cold read time of ``llmman.gguf.read_gguf`` (cache cleared each time),
one ``gguf.GGUFReader`` construction, and the ratio. Target for ours: under 20 ms.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ggufgen import write_gguf

from llmman.gguf import ArraySummary, clear_cache, read_gguf

VOCAB = 150_000
TARGET_MS = 20.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--merges", type=int, default=0, help="number of tokenizer merges to add")
    parser.add_argument("--repeat", type=int, default=10, help="cold reads of ours; the best is reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_gguf(Path(tmp) / "vocab150k.gguf", vocab=VOCAB, merges=args.merges)
        size_mb = path.stat().st_size / 1e6
        best = float("inf")
        for _ in range(args.repeat):
            clear_cache()
            start = time.perf_counter()
            info = read_gguf(path)
            best = min(best, time.perf_counter() - start)
        tokens = info.metadata["tokenizer.ggml.tokens"]
        assert isinstance(tokens, ArraySummary) and tokens.count == VOCAB
        assert info.chat_template is not None

        import gguf  # imported late: its import time is not part of either measurement

        start = time.perf_counter()
        reader = gguf.GGUFReader(path)
        theirs = time.perf_counter() - start
        assert len(reader.tensors) == info.tensor_count
    ours_ms, theirs_ms = best * 1000, theirs * 1000
    print(f"file: {size_mb:.1f} MB, {VOCAB} tokens, {args.merges} merges")
    print(f"llmman.gguf.read_gguf : {ours_ms:8.2f} ms (best of {args.repeat}, cold cache)")
    print(f"gguf.GGUFReader       : {theirs_ms:8.2f} ms")
    print(f"ratio                 : {theirs_ms / ours_ms:8.1f}x faster")
    print(f"target < {TARGET_MS:.0f} ms       : {'met' if ours_ms < TARGET_MS else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
