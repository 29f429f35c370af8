"""Docstrings and comments under src/llmman cite only what the repository holds.

A citation of ``reference/<x>.md`` or ``SPEC <letter>`` points at notes that live outside the repository, so a
reader cannot follow it: state the rule, point to a doc under docs/, or name the upstream source (an Ollama
API field, a llama.cpp flag, an OCI spec section). A ``docs/<x>.md`` citation must name a file that exists.
Upstream paths that merely contain ``docs/`` (``ggml/docs/gguf.md``, ``modelpack/model-spec/docs/spec.md``)
are not in-repo citations: only a ``docs/`` that starts a path counts.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "llmman"

OUTSIDE = re.compile(r"reference/[A-Za-z0-9_.-]+\.md|\bSPEC [A-Z]\b")
DOCS = re.compile(r"(?<![\w./-])docs/[A-Za-z0-9_./-]+?\.md\b")


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix not in (".pyc", ".so"))


def _hits(pattern: re.Pattern[str], *, only_missing: bool = False) -> list[str]:
    """``path:line: match`` for every match (only those naming no file of the repo, if asked)."""
    found = []
    for path in _sources():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in pattern.finditer(line):
                if not only_missing or not (ROOT / match.group()).is_file():
                    found.append(f"{path.relative_to(ROOT)}:{number}: {match.group()}")
    return found


def test_patterns_match_what_they_should() -> None:
    assert OUTSIDE.search("see reference/ollama.md §1.5")
    assert OUTSIDE.search("API keys (SPEC G): ...")
    assert not OUTSIDE.search("SPECIFIC rules; the spec says")
    assert DOCS.search("See docs/aggregation.md.").group() == "docs/aggregation.md"  # type: ignore[union-attr]
    assert DOCS.search("(``docs/memory.md``)").group() == "docs/memory.md"  # type: ignore[union-attr]
    assert not DOCS.search("GGUF spec, ggml/docs/gguf.md")
    assert not DOCS.search("(modelpack/model-spec/docs/spec.md)")


def test_no_citations_of_files_outside_the_repo() -> None:
    hits = _hits(OUTSIDE)
    assert not hits, "cite the rule, docs/ or the upstream source instead:\n" + "\n".join(hits)


def test_cited_docs_exist() -> None:
    missing = _hits(DOCS, only_missing=True)
    assert not missing, "cited docs that the repository does not have:\n" + "\n".join(missing)
