"""Reading llama-server's buffer-size lines (recorded from b11434) and the KV-cache arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmman.gguf import read_gguf
from llmman.sched.memory import Usage, estimate, parse_buffers

MIB = 1024 * 1024

# Gemma 3 270M, -c 8192 -np 2 --no-kv-unified -lv 4, CPU build (recorded).
GEMMA_LINES = [
    "0.00.932.645 I load_tensors:   CPU_Mapped model buffer size =   235.16 MiB",
    "0.00.932.651 I load_tensors:   CPU_REPACK model buffer size =    12.66 MiB",
    "0.00.952.437 I llama_context:        CPU  output buffer size =     2.00 MiB",
    "0.00.952.602 I llama_kv_cache:        CPU KV buffer size =    24.00 MiB",
    "0.00.964.122 I llama_kv_cache: size =   24.00 MiB (  4096 cells,   3 layers,  2/2 seqs)",
    "0.00.964.235 I llama_kv_cache:        CPU KV buffer size =    30.00 MiB",
    "0.00.981.662 I sched_reserve:        CPU compute buffer size =    23.28 MiB",
    "0.01.172.542 I srv    load_model: prompt cache is enabled, size limit: 8192 MiB",
]
# The same shape as Ollama parses on CUDA (llm/llama_server.go).
CUDA_LINES = [
    "load_tensors:        CUDA0 model buffer size =  4403.49 MiB",
    "load_tensors:   CPU_Mapped model buffer size =   281.81 MiB",
    "llama_kv_cache:      CUDA0 KV buffer size =   512.00 MiB",
    "llama_context:  CUDA_Host  output buffer size =     0.49 MiB",
    "sched_reserve:      CUDA0 compute buffer size =   258.50 MiB",
    "sched_reserve:  CUDA_Host compute buffer size =    16.01 MiB",
]


def test_parse_buffers_cpu() -> None:
    usage = parse_buffers(GEMMA_LINES)
    assert usage == Usage(host=int((235.16 + 12.66 + 2.0 + 24.0 + 30.0 + 23.28) * MIB), device=0)


def test_parse_buffers_cuda_splits_host_and_device() -> None:
    usage = parse_buffers(CUDA_LINES)
    assert usage is not None
    assert usage.device == int((4403.49 + 512.0 + 258.5) * MIB)
    assert usage.host == int((281.81 + 0.49 + 16.01) * MIB)


def test_parse_buffers_without_lines() -> None:
    assert parse_buffers(["llama_server: model loaded"]) is None


SMOL = Path.home() / ".cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.skipif(not SMOL.is_file(), reason="run scripts/setup.sh --model")
@pytest.mark.parametrize(
    ("n_ctx", "n_parallel", "cache", "kv_mib"),
    [(4096, 2, "f16", 180.0), (8192, 1, "f16", 180.0), (4096, 1, "q8_0", 90.0 * 34 / 32 / 2)],
)
def test_kv_cache_matches_llama_server(n_ctx: int, n_parallel: int, cache: str, kv_mib: float) -> None:
    # llama-server: "KV buffer size = 180.00 MiB" for SmolLM2 at 4096 x 2 slots (30 layers, 3 KV heads).
    e = estimate(read_gguf(SMOL), n_ctx=n_ctx, n_parallel=n_parallel, cache_type_k=cache, cache_type_v=cache)
    assert e.kv == pytest.approx(kv_mib * MIB, rel=1e-6)
    assert e.weights > 90 * MIB and e.output == 49152 * 4 * n_parallel
