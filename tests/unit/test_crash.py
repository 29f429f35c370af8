"""runner.crash.classify on llama-server b11434's own messages (recorded from real runs)."""

from __future__ import annotations

import pytest

from llmman.runner.crash import Cause, classify, evidence

OOM_CPU = [
    "0.15.780.766 W common_fit_params: failed to fit params to free device memory: was unable to fit model "
    "into system memory by reducing context, abort",
    "0.19.104.831 E ggml_aligned_malloc: insufficient memory (attempted to allocate 2197265.62 MB)",
    "0.19.104.841 E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size "
    "2304000000000",
    "0.19.243.286 E llama_init_from_model: failed to initialize the context: "
    "failed to allocate buffer for kv cache",
    "0.19.243.642 E srv    load_model: failed to create_context with model '/m/smol.gguf'",
]
OOM_CUDA = ["ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: "
            "cudaMalloc failed: out of memory",
            "E llama_model_load: error loading model: unable to allocate CUDA0 buffer"]
BAD_ARG = ["error: invalid argument: --mlock"]
MISSING = [
    "0.00.005.409 E gguf_init_from_file: failed to open GGUF file '/tmp/nonexist.gguf' (No such file or "
    "directory)",
    "0.00.005.538 E llama_model_load: error loading model: llama_model_loader: failed to load model from "
    "/tmp/nonexist.gguf",
]
PORT = ["0.00.013.513 E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, "
        "port: 18779",
        "0.00.013.713 E srv  llama_server: exiting due to HTTP server error"]
CORRUPT = [
    "0.00.056.158 E llama_model_load: error loading model: tensor 'token_embd.weight' data is not within the "
    "file bounds, model is corrupted or incomplete",
    "0.00.081.359 E srv    load_model: failed to load model, '/tmp/trunc.gguf'",
]


@pytest.mark.parametrize(
    ("lines", "code", "cause"),
    [
        (OOM_CPU, 1, Cause.OUT_OF_MEMORY),
        (OOM_CUDA, 1, Cause.OUT_OF_MEMORY),
        (["terminate called after throwing an instance of 'std::bad_alloc'"], -6, Cause.OUT_OF_MEMORY),
        (BAD_ARG, 1, Cause.BAD_ARGUMENT),
        (MISSING, 1, Cause.MISSING_FILE),
        (PORT, 1, Cause.PORT_IN_USE),
        (CORRUPT, 1, Cause.CORRUPT_MODEL),
        (["srv  update_slots: all slots are idle"], -9, Cause.KILLED),
        (["srv  update_slots: all slots are idle"], 1, Cause.UNKNOWN),
        ([], None, Cause.UNKNOWN),
    ],
)
def test_classify(lines: list[str], code: int | None, cause: Cause) -> None:
    assert classify(lines, code) is cause


def test_evidence_is_the_deciding_line_without_its_prefix() -> None:
    assert evidence(PORT, Cause.PORT_IN_USE).startswith("srv         start: couldn't bind")
    assert evidence(PORT, Cause.OUT_OF_MEMORY) == ""
