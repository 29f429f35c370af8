"""Why did a llama-server child die? A pure classification of its last output lines.

:func:`classify` reads the child's recent stderr/stdout lines (oldest first) and names the cause, so
``/api/ps``, ``llmman ps``, the log and the 503 of a cooling-down model can say why a model failed.
The patterns are llama-server b11434's own messages, recorded from real runs (tests/unit/test_crash.py):

- out of memory: ``ggml_aligned_malloc: insufficient memory``, ``failed to allocate CPU buffer``,
  ``cudaMalloc failed: out of memory``, ``failed to allocate buffer for kv cache``, ``std::bad_alloc``,
  Vulkan's ``Device memory allocation of size ... failed``;
- bad argument: ``error: invalid argument: --mlock``, ``error: unknown argument``;
- missing file: ``gguf_init_from_file: failed to open GGUF file '...' (No such file or directory)``;
- port in use: ``couldn't bind HTTP server socket, hostname: H, port: P``;
- corrupt model: ``error loading model: tensor '...' data is not within the file bounds, model is
  corrupted or incomplete`` and other ``error loading model`` / ``failed to read`` lines.

The first matching rule in :data:`RULES` order wins (out of memory before corrupt model: an allocation
failure is also reported as a failed load).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable


class Cause(enum.Enum):
    """The classified cause of a child's death; the value is what users see."""

    OUT_OF_MEMORY = "out of memory"
    BAD_ARGUMENT = "bad argument"
    MISSING_FILE = "missing file"
    PORT_IN_USE = "port in use"
    CORRUPT_MODEL = "corrupt or unsupported model file"
    KILLED = "killed by a signal"
    HUNG = "stopped answering /health"
    UNKNOWN = "unknown"


RULES: tuple[tuple[Cause, re.Pattern[str]], ...] = (
    (Cause.OUT_OF_MEMORY, re.compile(
        r"insufficient memory|out of memory|failed to allocate|bad_alloc|cannot allocate memory"
        r"|memory allocation of size .* failed|unable to allocate", re.IGNORECASE)),
    (Cause.BAD_ARGUMENT, re.compile(r"error: (invalid|unknown) argument|error while handling argument")),
    (Cause.MISSING_FILE, re.compile(r"No such file or directory|failed to open GGUF file")),
    (Cause.PORT_IN_USE, re.compile(r"couldn't bind HTTP server socket|Address already in use")),
    (Cause.CORRUPT_MODEL, re.compile(
        r"model is corrupted or incomplete|error loading model|failed to read (magic|header|tensor)"
        r"|invalid magic|unknown model architecture")),
)  # fmt: skip


def classify(lines: Iterable[str], returncode: int | None = None) -> Cause:
    """The cause named by the first rule any of ``lines`` matches; else KILLED for a negative
    ``returncode`` (a signal: ``kill -9``, the OOM killer), else UNKNOWN."""
    text = list(lines)
    for cause, pattern in RULES:
        if any(pattern.search(line) for line in text):
            return cause
    if returncode is not None and returncode < 0:
        return Cause.KILLED
    return Cause.UNKNOWN


def evidence(lines: Iterable[str], cause: Cause) -> str:
    """The line that decided ``cause`` (stripped of llama-server's time/level prefix), or ``""``."""
    for c, pattern in RULES:
        if c is cause:
            for line in lines:
                if pattern.search(line):
                    return re.sub(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ", "", line.strip())
    return ""
