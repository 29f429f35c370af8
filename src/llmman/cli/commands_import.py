"""``llmman import``: models already on disk into the store (being built; see issue 14)."""

from __future__ import annotations

import argparse

from llmman.config.settings import Settings
from llmman.errors import NotImplementedHere

__all__ = ["cmd_import"]


def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    """Not built yet."""
    raise NotImplementedHere("llmman import is not built yet")
