"""llama-server children: argv building (pure), finding the binary, and one owner per child process.

The runner knows nothing of stores, peers or API dialects: it starts a GGUF file as a llama-server
child, tells when it is ready, notices when it dies, and stops it.
"""

from __future__ import annotations

from llmman.runner.argv import LaunchSpec, build_argv, child_env
from llmman.runner.binary import find_llama_server, free_port
from llmman.runner.process import LlamaServerProcess, RunnerState

__all__ = [
    "LaunchSpec",
    "LlamaServerProcess",
    "RunnerState",
    "build_argv",
    "child_env",
    "find_llama_server",
    "free_port",
]
