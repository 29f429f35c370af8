"""``llmman import [SOURCE ...] [--name REF] [-n|--dry-run] [--store DIR]``: the models already on disk.

SOURCE is a keyword (``ollama``, ``hf``, ``llama.cpp``, ``lmstudio``: their folders as
:mod:`llmman.config.model_dirs` resolves them), a folder (any depth) or one GGUF file; with none, every
keyword's folder that exists. Works on the store directly, like ``build``: a running daemon sees the new
models at its next lookup. One line per model found::

    imported   ollama.com/library/smollm2:135m   98.2 MB  hard link   (~/.ollama/models/manifests/...)
    skipped    localhost/x:latest                          a model of that name is already in the store ...

then ``N imported, N updated, N unchanged, N skipped, N failed``. Exit status 1 when a model failed
or a SOURCE path does not exist, else 0 (nothing found is not an error).
"""

from __future__ import annotations

import argparse
import sys

from llmman.config.model_dirs import KEYWORDS
from llmman.config.settings import Settings
from llmman.store import Store
from llmman.store.imports import Outcome, discover_sources, import_all, sources_of

__all__ = ["cmd_import"]


def _size(n: int) -> str:
    from llmman.cli.commands_pull import _human

    return _human(n) if n > 0 else ""


def _line(outcome: Outcome) -> None:
    from llmman.cli.tables import printable

    tail = outcome.detail if outcome.state in ("skipped", "failed") else f"({outcome.source})"
    if outcome.detail and outcome.state not in ("skipped", "failed"):
        tail += f"; {outcome.detail}"
    print(printable(f"{outcome.state:<12} {outcome.name:<48} {_size(outcome.size):>9}  {outcome.how:<10} "
                    f"{tail}").rstrip())


def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    """Find the models SOURCE names and import them into the store (see the module docstring)."""
    words = list(args.sources or [])
    sources = sources_of(words, settings.environment.model_dirs)
    if not sources:
        print(f"no model folders found (looked for {', '.join(KEYWORDS)})")
        return 0
    found = discover_sources(sources)
    outcomes = import_all(Store(settings.models), found, name=args.name, dry_run=args.dry_run,
                          on_outcome=_line)
    if not outcomes:
        print(f"no models found in {', '.join(str(p) for p, _ in sources)}")
        return 0
    counts = {s: sum(o.state == s for o in outcomes)
              for s in ("imported", "updated", "unchanged", "would import", "present", "skipped", "failed")}
    print(", ".join(f"{n} {s}" for s, n in counts.items() if n or s in ("imported", "skipped")),
          file=sys.stderr)
    return 1 if counts["failed"] else 0
