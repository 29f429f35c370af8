"""``python -m llmman``: the same as the ``llmman`` command (also how ``run`` starts a daemon)."""

from __future__ import annotations

import sys

from llmman.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
