"""Shared test setup.

Its presence makes pytest put the repository root on ``sys.path`` (``tests`` is a package), so any test
can import the shared helpers under ``tests.fakes`` and ``tests.integration`` whichever folder is run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.closing import close_all


@pytest.fixture(autouse=True)
def _close_sdk_clients() -> Iterator[None]:
    """Close the SDK clients the test wrapped in :func:`tests.closing.closed_after_test`."""
    yield
    close_all()
