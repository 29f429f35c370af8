"""Parsing the repository's Python sources in tests, safe from a CPython 3.11 quirk.

CPython 3.11's AST constructor checks that its recursion depth is the same after building the tree as
before; a garbage collection in the middle of it that runs a finalizer (an unclosed socket left by an
earlier test warning as it is collected) can break that check with ``SystemError: AST constructor
recursion depth mismatch`` (python/cpython#106905). :func:`parse_source` holds the collector off while it
parses; garbage is collected afterwards as usual.
"""

from __future__ import annotations

import ast
import gc

__all__ = ["parse_source"]


def parse_source(source: str) -> ast.Module:
    """``ast.parse(source)`` with the garbage collector paused for the call."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()
