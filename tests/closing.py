"""SDK clients that a test closes when it ends.

The suite runs with ``filterwarnings = ["error"]``. An official SDK client (``ollama.Client``,
``openai.OpenAI``, ``anthropic.Anthropic``: each holds an httpx connection pool) that a test drops with a
connection still open leaves its socket to the garbage collector, and the ``ResourceWarning`` then fails
whichever test happens to be running at the time. Wrap the client where the test makes it,
``client = closed_after_test(ollama.Client(host=url))``, and the autouse fixture in tests/conftest.py closes
it when that test ends, pass or fail. For clients made inside a test, not in fixtures of a wider scope.
"""

from __future__ import annotations

from typing import Protocol, TypeVar


class Closeable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closeable)

OPEN: list[Closeable] = []


def closed_after_test(client: C) -> C:
    """``client``, closed when the running test ends."""
    OPEN.append(client)
    return client


def close_all() -> None:
    """Close every client :func:`closed_after_test` was given (the conftest fixture calls this)."""
    while OPEN:
        OPEN.pop().close()
